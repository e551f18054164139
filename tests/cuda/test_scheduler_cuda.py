"""The engine's scheduler on CUDA (issue 40, items 2 and 3; docs/design/batching.md): the
tiny export pair in float16 with the fused static graphs and a 4-row batched graph, requests
decoded together on the device equal each alone token for token (the fixtures have no
near-ties) for greedy, prompt lookup and the chained drafter at fixed k and ``k="auto"``,
with prompts in chunks and more requests than rows (they join as others leave). The batched
passes run eagerly (no CUDA graph per ``(rows, W)`` yet: docs/design/batching.md).

Run on the GPU machine: ``pytest -m cuda tests/cuda/test_scheduler_cuda.py``.
"""

from __future__ import annotations

import pytest
from gpu_probe import cuda_marks

import speculant
from export.export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS, write_tokenizer
from speculant_tools.export import write_pair_package

pytestmark = cuda_marks()
ROWS = 4
PROMPTS = [[7, 3, 41, 12], [9, 2, 5], [33, 48, 2, 17, 5, 6, 30, 11, 40, 9, 9, 9],
           [14, 8, 21, 3, 3], [22, 22, 22, 22, 22, 22, 22, 22, 22], [40, 41, 42, 40, 41, 42, 40]]
RUNNERS = [{}, {"proposer": "prompt_lookup", "k": 2}, {"proposer": "chained", "k": 2},
           {"proposer": "chained", "k": 4}, {"proposer": "chained", "k": "auto"}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> speculant.Engine:
    base = tmp_path_factory.mktemp("scheduler-cuda")
    root = write_pair_package(base / "pair", TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS,
                              write_tokenizer(base / "tokenizer.json"), dtype="float16",
                              graph="fused", cache="static", batch=ROWS)
    return speculant.load(root, device="cuda", max_batch=ROWS, prefill_chunk=4)


def options(runner: dict) -> speculant.GenerationOptions:
    return speculant.GenerationOptions(max_new_tokens=20, stop_on_eos=False, **runner)


@pytest.mark.parametrize("runner", RUNNERS, ids=lambda r: f"{r.get('proposer')}-{r.get('k')}")
def test_requests_decoded_together_on_cuda_equal_each_alone(engine, runner):
    together = engine.generate_many(PROMPTS, options(runner))
    for prompt, got in zip(PROMPTS, together, strict=True):
        assert got.token_ids == engine.generate(prompt, options(runner)).token_ids
        assert got.stats.rollback_bytes_moved == 0
    if runner:  # the rows drafted, and their drafts were verified in the batched passes
        assert sum(got.stats.drafts_proposed for got in together) > 0

