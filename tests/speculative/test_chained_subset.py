"""A chained drafter with a subset vocabulary (``speculative.vocabulary: subset``): its logits
score only the target's first N ids, each used unchanged as a target id.

The fixture pair with ``proposer_vocab_size = 20``: the drafter's one-hot row is cut to its
first 20 columns, so wherever the target's next token is >= 20 the draft is ``<unk>`` and is
rejected. Greedy speculation still commits exactly the greedy stream with the reference's
(k_r, a_r) trace, and sampling (q over 20 ids, read as 0 beyond them by the verifier) still
follows the target's distribution (runtime.md §17).
"""

from __future__ import annotations

import pytest
from chain_helpers import MAX_NEW, PROBE_PROMPT, PROMPTS, SPEC, run_recorded
from proposer_helpers import assert_follows, exact_marginals
from test_sampling import NUM_TOKENS, TEMPERATURE, sampled_tokens

import speculant
from builders import definition as fx
from builders import speculative_trace

SUBSET = 20
SUBSET_SPEC = fx.make_spec(proposer_vocab_size=SUBSET)  # the same target function as SPEC
WIDTHS = (1, 2, 4)


@pytest.fixture(scope="module")
def subset_engine(pair_root) -> speculant.Engine:
    return speculant.load(pair_root(proposer_vocab_size=SUBSET))


def subset_trace(prompt, k: int):
    return speculative_trace(SUBSET_SPEC, list(prompt), MAX_NEW, k, rollback_bound=8)


def test_the_package_declares_the_subset(subset_engine):
    vocabulary = subset_engine.package.document.speculative.vocabulary
    assert (vocabulary.kind, vocabulary.proposer_vocab_size) == ("subset", SUBSET)


@pytest.mark.parametrize("k", WIDTHS)
def test_greedy_speculation_with_a_subset_drafter_equals_greedy(subset_engine, k):
    """E1 and the exact trace: the committed tokens are the plain greedy stream, and every
    round's drafts and (k_r, a_r) are the subset reference's."""
    lost = 0  # drafts the identical-vocabulary drafter would have had accepted
    for prompt in PROMPTS:
        greedy = subset_engine.generate(list(prompt), MAX_NEW).token_ids
        with pytest.MonkeyPatch.context() as mp:
            rec = run_recorded(subset_engine, mp, prompt, k)
        assert rec.error is None, f"the run raised {rec.error!r}"
        assert rec.tokens == greedy
        expected = subset_trace(prompt, k)
        assert rec.tokens == expected.tokens
        assert rec.stats.trace == expected.pairs()
        assert [tuple(p.drafts) for p in rec.proposals] == expected.drafts()
        assert all(d < SUBSET for p in rec.proposals for d in p.drafts)
        full = speculative_trace(SPEC, list(prompt), MAX_NEW, k, rollback_bound=8)
        lost += full.counters()["accepted_drafts"] - rec.stats.accepted_drafts
    assert lost > 0, "the subset never cost an accepted draft: the test does not exercise it"


@pytest.mark.parametrize("k", WIDTHS)
def test_top_k_one_with_a_subset_drafter_is_the_greedy_trace(subset_engine, k):
    """top_k = 1: every T(row) is one-hot, q included (over 20 ids): the greedy trace."""
    for prompt, seed in ((PROBE_PROMPT, 0), (PROMPTS[2], 3)):
        result = subset_engine.generate(list(prompt), MAX_NEW, proposer="chained", k=k,
                                        temperature=2.0, top_k=1, seed=seed)
        expected = subset_trace(prompt, k)
        assert result.token_ids == expected.tokens
        assert result.stats.trace == expected.pairs()
        assert result.stats.sampled_rows > 0


@pytest.mark.parametrize("k", (1, 4))
def test_sampling_with_a_subset_drafter_follows_the_target_distribution(subset_engine, k):
    """E7 / evidence.md §5 with a subset proposer: each of the first generated tokens follows
    the target's exact sampled marginal over many seeds, and drafts are accepted."""
    samples = sampled_tokens(subset_engine, PROBE_PROMPT, "chained", k)
    marginals = exact_marginals(SPEC, PROBE_PROMPT, NUM_TOKENS, TEMPERATURE)
    for i in range(NUM_TOKENS):
        assert_follows(samples[:, i], marginals[i], f"subset k={k}: token {i + 1}")
    accepted = sum(subset_engine.generate(list(PROBE_PROMPT), k + 2, temperature=TEMPERATURE,
                                          seed=seed, proposer="chained", k=k,
                                          stop_on_eos=False).stats.accepted_drafts
                   for seed in range(20))
    assert accepted > 0
