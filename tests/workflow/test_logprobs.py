"""Log-probabilities of committed tokens come from the rows that chose them (the prefill's
last row, a verify pass's rows): greedy and speculative decoding report the same values."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import speculant
from speculant import GenerationOptions, RequestError
from speculant.workflow.logprobs import entries

DEMO = Path(speculant.__file__).parent / "demo"
PROMPT = "def fib(n):\n    "
# A pass over k + 1 rows rounds its float32 matmuls unlike a one-row pass: the scores, and so
# the log-probabilities, agree to the last bits only (4.8e-6 at most on the demo pair).
FLOAT32_PASS_ROUNDING = 1e-4


@pytest.fixture(scope="module")
def demo() -> speculant.Engine:
    return speculant.load(DEMO)


def test_entries_are_the_log_softmax_and_the_most_probable_ids():
    rows = np.array([[0.0, 1.0, 2.0, 3.0], [5.0, 0.0, 0.0, 0.0]], np.float32)
    found = entries(rows, [1, 0], 2)
    expected = rows[0] - np.log(np.exp(rows[0]).sum())
    assert found[0].token == 1 and math.isclose(found[0].logprob, expected[1], rel_tol=1e-6)
    assert [i for i, _ in found[0].top] == [3, 2]
    assert found[1].top[0][0] == 0 and found[1].logprob == found[1].top[0][1]


@pytest.mark.parametrize("proposer, k", [("chained", 4), ("prompt_lookup", 3)])
def test_speculative_logprobs_are_greedys(demo, proposer, k):
    greedy = demo.generate(PROMPT, GenerationOptions(max_new_tokens=32, logprobs=3))
    speculative = demo.generate(PROMPT, GenerationOptions(max_new_tokens=32, logprobs=3,
                                                          proposer=proposer, k=k))
    assert speculative.token_ids == greedy.token_ids
    assert [e.token for e in greedy.logprobs] == greedy.token_ids
    for plain, drafted in zip(greedy.logprobs, speculative.logprobs, strict=True):
        assert abs(plain.logprob - drafted.logprob) < FLOAT32_PASS_ROUNDING
        assert [i for i, _ in plain.top] == [i for i, _ in drafted.top]
    if proposer == "chained":
        assert speculative.stats.mean_accepted_length > 1  # rows of verify passes were read


def test_greedy_tokens_are_their_rows_most_probable(demo):
    result = demo.generate(PROMPT, GenerationOptions(max_new_tokens=16, logprobs=2))
    for entry in result.logprobs:
        assert entry.top[0] == (entry.token, entry.logprob) and entry.logprob <= 0
        assert len(entry.top) == 2 and entry.top[0][1] >= entry.top[1][1]


def test_prompt_logprobs_score_each_prompt_token_by_the_row_before_it(demo):
    result = demo.generate(PROMPT, GenerationOptions(max_new_tokens=4, logprobs=0,
                                                     prompt_logprobs=True))
    prompt_ids = demo.tokenizer.encode(PROMPT)
    assert result.prompt_logprobs[0] is None and len(result.prompt_logprobs) == len(prompt_ids)
    assert [e.token for e in result.prompt_logprobs[1:]] == prompt_ids[1:]
    assert all(e.logprob <= 0 and e.top == () for e in result.prompt_logprobs[1:])
    # the first prompt token's row scored the second: the same as a one-token prompt's first
    alone = demo.generate(prompt_ids[:1], GenerationOptions(max_new_tokens=1, logprobs=0))
    if alone.token_ids == prompt_ids[1:2]:
        assert abs(alone.logprobs[0].logprob - result.prompt_logprobs[1].logprob) < 1e-4


def test_without_logprobs_none_are_recorded(demo):
    result = demo.generate(PROMPT, GenerationOptions(max_new_tokens=4))
    assert result.logprobs is None and result.prompt_logprobs is None


def test_a_bad_logprobs_count_is_a_request_error(demo):
    with pytest.raises(RequestError) as refused:
        demo.generate(PROMPT, GenerationOptions(max_new_tokens=4, logprobs=-1))
    assert refused.value.problems[0].path == "logprobs"
