"""E1, E2 and the exact trace: chained speculation commits exactly the target's greedy stream,
greedy equals the full-recompute oracle, and every round's (k_r, a_r) is the reference's.

Matrix: k in {1, 2, 3, 4, 8} x {float32, float16} x {.onnx, .onnx.textproto}, over prompts
that run to the budget, stop on EOS at the end of a round, and stop on an EOS that cuts a
round short. The runs are recorded once per session (conftest ``recorded``) and shared with
the accounting tests.
"""

from __future__ import annotations

import pytest
from chain_helpers import (
    MAX_NEW,
    PROMPTS,
    SPEC,
    WIDTHS,
    check_exact_trace,
    check_tokens_equal_greedy,
    full_recompute_greedy,
    reference_trace,
)

import speculant
from builders import EOS_ID, greedy_stream

DTYPES = ("float32", "float16")
FORMATS = ("onnx", "textproto")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", WIDTHS)
def test_speculative_equals_plain_greedy(recorded, plain_greedy, dtype, fmt, k):
    """E1: token for token, against the same runtime decoding without a proposer."""
    num_full_accepts = num_rollbacks = 0
    for prompt in PROMPTS:
        rec = recorded(prompt, k, dtype, fmt)
        check_tokens_equal_greedy(rec, plain_greedy(prompt, dtype, fmt))
        assert rec.stats.drafts_proposed > 0
        num_full_accepts += rec.stats.full_accepts
        num_rollbacks += rec.stats.rollbacks
    # The prompts exercise both outcomes of a round at this width.
    assert num_full_accepts > 0, "no round accepted every draft"
    assert num_rollbacks > 0, "no round rejected a draft"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_equals_full_recompute_oracle(pair_engine, plain_greedy, dtype, fmt):
    """E2: the cache-reusing greedy decode equals re-running the target over the whole
    stream from empty caches for every token, and the fixture's definition."""
    engine = pair_engine(dtype, fmt)
    for prompt in PROMPTS:
        greedy = plain_greedy(prompt, dtype, fmt)
        assert greedy == full_recompute_greedy(engine, prompt, MAX_NEW)
        assert greedy == greedy_stream(SPEC, list(prompt), MAX_NEW)


def test_decoder_package_greedy_equals_full_recompute_oracle(decoder_root):
    """E2 on the plain decoder package (the same function, no proposer)."""
    engine = speculant.load(decoder_root)
    for prompt in PROMPTS[:2]:
        greedy = engine.generate(list(prompt), MAX_NEW).token_ids
        assert greedy == full_recompute_greedy(engine, prompt, MAX_NEW)
        assert greedy == greedy_stream(SPEC, list(prompt), MAX_NEW)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", WIDTHS)
def test_trace_equals_reference(recorded, dtype, fmt, k):
    """The exact per-round (k_r, a_r), the drafts and every counter equal those computed
    from the fixture's definition (``speculative_trace``)."""
    for prompt in PROMPTS:
        rec = recorded(prompt, k, dtype, fmt)
        check_exact_trace(rec)
        assert rec.tokens == reference_trace(prompt, k, MAX_NEW, dtype).tokens


def test_eos_cut_discards_the_rest_of_the_round(recorded):
    """Prompt (2, 11) at k = 4: the last round's first draft is EOS and more drafts after it
    are accepted; only the EOS is returned and no pass runs after it."""
    rec = recorded((2, 11), 4)
    last_k, last_a = rec.stats.trace[-1]
    assert rec.stats.stop_reason == "eos" and rec.tokens[-1] == EOS_ID
    assert rec.proposals[-1].drafts[0] == EOS_ID and last_a > 2
    assert rec.stats.committed == len(rec.tokens) < 1 + sum(a for _, a in rec.stats.trace)
    assert len(rec.passes) == rec.stats.target_passes
