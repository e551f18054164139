"""The bench's bare ORT run on a session made for CUDA graphs (speculant_bench/timing.py):
its binding has a graph id of its own, so what it times is the pass it bound. Without one,
ORT replays graph id 0 (the first plan captured: the width-1 greedy pass), whatever the
binding holds, and every width's "bare run" was that pass.

Run on the GPU machine: ``pytest -m cuda tests/cuda/test_bench_bare_run_cuda.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_probe import cuda_marks

import speculant
from speculant.session.plan import CAPTURE_RUNS
from speculant_bench.timing import bare_run, prefilled
from speculant_tools.export import convert

pytestmark = cuda_marks()


@pytest.fixture(scope="module")
def demo_static(tmp_path_factory):
    demo = speculant.__file__.rsplit("/", 1)[0] + "/demo"
    return convert(demo, tmp_path_factory.mktemp("demo") / "static", "float16", cache="static")


def test_a_bare_run_times_the_pass_it_bound(demo_static):
    engine = speculant.load(demo_static, device="cuda", cuda_graphs="auto")
    prompt = engine.tokenizer.encode("def fibonacci(n):\n    return")
    engine.generate(prompt, 8, stop_on_eos=False)  # the greedy plans: width 1 captures first
    assert engine.seam.counters.graph_captures > 0
    block = prompt[:5]
    state = prefilled(engine, prompt, len(block))
    controls = dict(state.admitted.initial_controls)
    bare = bare_run(engine, block, state.consumed, state.cells, state.admitted, controls)
    for _ in range(CAPTURE_RUNS + 1):  # captured on the third run, then replayed
        bare()
    outputs = list(engine.package.plan.target_outputs)
    got = bare.binding.copy_outputs_to_cpu()[outputs.index(engine.target.logits_port)]
    want = engine.target.run(block, state.consumed, state.cells, state.admitted, controls)
    want = engine.seam.adopt(want.logits, "host").data
    assert got.shape == want.shape == (1, len(block), want.shape[-1])
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-2)
