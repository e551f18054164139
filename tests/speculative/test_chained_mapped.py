"""A chained drafter with a mapped vocabulary (``speculative.vocabulary: mapped``): its logits
score ``V_q`` proposer ids, and the package's map names the target id of each.

The fixture pair's drafter keeps the 21 columns of its one-hot row that the map names (target
ids that are not 1 mod 3, so most lie at or beyond 21: only the map can draft them). Where the
target's next token is outside the map the draft is the map's first id and is rejected. Greedy
speculation commits exactly the greedy stream with the reference's (k_r, a_r) trace, and
sampling (q over the target's ids, 0 off the map) follows the target's distribution.
"""

from __future__ import annotations

import pytest
from chain_helpers import MAX_NEW, PROBE_PROMPT, PROMPTS, SPEC, run_recorded
from proposer_helpers import assert_follows, exact_marginals
from test_sampling import NUM_TOKENS, TEMPERATURE, sampled_tokens

import speculant
from builders import definition as fx
from builders import speculative_trace

MAP = tuple(i for i in range(fx.VOCAB_SIZE) if i % 3 != 1)  # 21 ascending target ids
MAPPED_SPEC = fx.make_spec(proposer_vocab_map=MAP)  # the same target function as SPEC
WIDTHS = (1, 2, 4)


@pytest.fixture(scope="module")
def mapped_engine(pair_root) -> speculant.Engine:
    return speculant.load(pair_root(proposer_vocab_map=MAP))


def mapped_trace(prompt, k: int):
    return speculative_trace(MAPPED_SPEC, list(prompt), MAX_NEW, k, rollback_bound=8)


def test_the_package_declares_the_map(mapped_engine):
    vocabulary = mapped_engine.package.document.speculative.vocabulary
    assert vocabulary.kind == "mapped"
    assert (mapped_engine.package.root / vocabulary.artifact).stat().st_size == 8 * len(MAP)


@pytest.mark.parametrize("k", WIDTHS)
def test_greedy_speculation_with_a_mapped_drafter_equals_greedy(mapped_engine, k):
    """The committed tokens are the plain greedy stream, and every round's drafts and
    (k_r, a_r) are the mapped reference's: drafts are target ids, some beyond V_q."""
    lost = 0  # drafts the identical-vocabulary drafter would have had accepted
    drafted = set()
    for prompt in PROMPTS:
        greedy = mapped_engine.generate(list(prompt), MAX_NEW).token_ids
        with pytest.MonkeyPatch.context() as mp:
            rec = run_recorded(mapped_engine, mp, prompt, k)
        assert rec.error is None, f"the run raised {rec.error!r}"
        assert rec.tokens == greedy
        expected = mapped_trace(prompt, k)
        assert rec.tokens == expected.tokens
        assert rec.stats.trace == expected.pairs()
        assert [tuple(p.drafts) for p in rec.proposals] == expected.drafts()
        drafted.update(d for p in rec.proposals for d in p.drafts)
        full = speculative_trace(SPEC, list(prompt), MAX_NEW, k, rollback_bound=8)
        lost += full.counters()["accepted_drafts"] - rec.stats.accepted_drafts
    assert drafted <= set(MAP)
    assert max(drafted) >= len(MAP), "no draft needed the map: the test does not exercise it"
    assert lost > 0, "the map never cost an accepted draft: the test does not exercise it"


def test_k_auto_with_a_mapped_drafter_equals_greedy(mapped_engine):
    for prompt in PROMPTS:
        greedy = mapped_engine.generate(list(prompt), MAX_NEW).token_ids
        result = mapped_engine.generate(list(prompt), MAX_NEW, proposer="chained", k="auto")
        assert result.token_ids == greedy


@pytest.mark.parametrize("k", WIDTHS)
def test_top_k_one_with_a_mapped_drafter_is_the_greedy_trace(mapped_engine, k):
    """top_k = 1: every T(row) is one-hot, q included (over the target's ids): the greedy
    trace, so the sampled drafts are the mapped target ids too."""
    for prompt, seed in ((PROBE_PROMPT, 0), (PROMPTS[2], 3)):
        result = mapped_engine.generate(list(prompt), MAX_NEW, proposer="chained", k=k,
                                        temperature=2.0, top_k=1, seed=seed)
        expected = mapped_trace(prompt, k)
        assert result.token_ids == expected.tokens
        assert result.stats.trace == expected.pairs()
        assert result.stats.sampled_rows > 0


@pytest.mark.parametrize("k", (1, 4))
def test_sampling_with_a_mapped_drafter_follows_the_target_distribution(mapped_engine, k):
    """Each of the first generated tokens follows the target's exact sampled marginal over
    many seeds, and drafts are accepted."""
    samples = sampled_tokens(mapped_engine, PROBE_PROMPT, "chained", k)
    marginals = exact_marginals(SPEC, PROBE_PROMPT, NUM_TOKENS, TEMPERATURE)
    for i in range(NUM_TOKENS):
        assert_follows(samples[:, i], marginals[i], f"mapped k={k}: token {i + 1}")
    accepted = sum(mapped_engine.generate(list(PROBE_PROMPT), k + 2, temperature=TEMPERATURE,
                                          seed=seed, proposer="chained", k=k,
                                          stop_on_eos=False).stats.accepted_drafts
                   for seed in range(20))
    assert accepted > 0
