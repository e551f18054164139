"""Chained rounds queued behind one another on the GPU (speculative/ahead.py): the next
round's start, ``s``, ``p``, ``carry_0``, positions and length are advanced on the device
from the last round's acceptance before the host reads it. The same tokens and the same
rounds as one round at a time, eager and replayed; the seam's cursor writes are the host's
element for element.

Run on the GPU machine: ``pytest -m cuda tests/cuda/test_rounds_ahead_cuda.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_probe import cuda_marks

import speculant
from speculant.session.plan import CAPTURE_RUNS
from speculant_tools.export import convert

pytestmark = cuda_marks()


@pytest.fixture(scope="module")
def demo_static(tmp_path_factory):
    demo = speculant.__file__.rsplit("/", 1)[0] + "/demo"
    return convert(demo, tmp_path_factory.mktemp("demo") / "static", "float16", cache="static")


@pytest.mark.parametrize("unroll", [False, True])
@pytest.mark.parametrize("graphs", [False, "auto"])
@pytest.mark.parametrize("k", [1, 4, 8, "auto"])
def test_queued_rounds_equal_rounds_one_at_a_time(demo_static, k, graphs, unroll):
    one_at_a_time = speculant.load(demo_static, device="cuda", cuda_graphs=graphs)
    one_at_a_time.target.queue_depth = 0
    prompt = one_at_a_time.tokenizer.encode("def fibonacci(n):\n")
    engine = speculant.Engine(one_at_a_time.package, "cuda", cuda_graphs=graphs,
                              unroll_chain=unroll)
    assert engine.target.queue_depth == 1  # a device's default
    calls = []
    propose_after = engine.proposer.propose_after
    engine.proposer.propose_after = lambda state, after, cursor, width: (
        calls.append(after is not None) or propose_after(state, after, cursor, width))
    want = one_at_a_time.generate(prompt, 64, speculative=True, k=k, stop_on_eos=False)
    got = engine.generate(prompt, 64, speculative=True, k=k, stop_on_eos=False)
    assert got.token_ids == want.token_ids
    # rounds queued behind rounds (k="auto" may take its greedy steps instead: queued steps)
    assert sum(calls) > 0 or (k == "auto" and got.stats.queued_passes > 0)
    if k != "auto":  # auto chooses from measured times: its widths may differ run to run
        assert got.stats.trace == want.stats.trace and got.stats.accepted_drafts > 0
    assert got.stats.rollback_bytes_moved == 0
    if graphs:
        assert got.stats.residency["graph_replays"] > 0
    if unroll:  # one run per proposal, and with graphs the warm-up's before the first round:
        # each width the policy may choose run until captured (k="auto": then timed once)
        ahead = ((CAPTURE_RUNS + 1) * engine.proposer.max_k if k == "auto" else CAPTURE_RUNS) \
            if graphs else 0
        chains = engine.proposer._chain_sessions
        assert sum(session.num_invocations for session in chains.values()) == \
            got.stats.rounds + ahead


@pytest.mark.parametrize("dtype", ["float16", "float32", "int64"])
def test_the_cursor_writes_match_the_host(dtype):
    """write_arange_from, take_at (every axis, every offset, clamped) and add_first: the
    CUDA kernels write what the host backend writes."""
    from speculant.tensors import Value, make_seam

    seam, host = make_seam("cuda"), make_seam("cpu")
    rng = np.random.default_rng(5)
    src = rng.integers(-50, 50, size=(2, 5, 3)).astype(dtype)
    on = {"host": (host, Value.host(src, dtype)),
          "cuda:0": (seam, seam.adopt(Value.host(src, dtype), "cuda:0"))}
    for axis in range(3):
        shape = [*src.shape]
        shape[axis] = 1
        for at, offset in ((0, 0), (3, -1), (4, 0), (9, 0), (0, -1)):
            got = {}
            for where, (s, source) in on.items():
                index = s.write_ints(s.zeros((1,), "int32", where), [at])
                dst = s.take_at(s.zeros(shape, dtype, where), source, axis, index, offset)
                got[where] = s.adopt(dst, "host").data.tolist()
            assert got["host"] == got["cuda:0"], (axis, at, offset)
    for int_dtype in ("int32", "int64"):
        got = {}
        for where, s in (("host", host), ("cuda:0", seam)):
            start = s.write_ints(s.zeros((1,), "int32", where), [37])
            counts = s.write_ints(s.zeros((3,), "int32", where), [4, 9, 9])
            s.add_first(start, counts)
            buffer = s.write_arange_from(s.zeros((2, 3), int_dtype, where), start, 1, -1)
            length = s.write_arange_from(s.zeros((1,), int_dtype, where), start, 0)
            got[where] = (s.adopt(buffer, "host").data.tolist(),
                          s.adopt(length, "host").data.tolist())
        assert got["host"] == got["cuda:0"] == ([[40, 41, 42], [43, 44, 45]], [41])
