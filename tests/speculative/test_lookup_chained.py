"""``lookup_chained``: each round drafts with prompt lookup (the continuation of the last 2-3
tokens, or of the last token alone) or the chained drafter, whichever this request's own
rounds say drafts better (speculative/lookup_chained.py). Its output is the target's
(greedy == plain greedy; seeded sampling == plain seeded sampling); each round's drafts are
exactly its chosen source's; the choice follows the measured averages (SourceChoice on
literal streams)."""

from __future__ import annotations

import pytest
from chain_helpers import MAX_NEW, PROMPTS
from test_prompt_lookup import REPETITIVE

from speculant import GenerationOptions
from speculant.speculative.chained import ChainedProposer
from speculant.speculative.lookup_chained import (
    CHAINED,
    LOOKUP,
    LOOKUP1,
    PRIORS,
    WEIGHT,
    LookupChainedProposer,
    SourceChoice,
)
from speculant.speculative.prompt_lookup import NgramIndex

ALL_PROMPTS = (*PROMPTS, *REPETITIVE)


def _recording(monkeypatch) -> list[tuple[str, list[int], list[int], int]]:
    """Every round's (source, stream, drafts, k) as the proposer chose them."""
    rounds: list[tuple[str, list[int], list[int], int]] = []
    propose = LookupChainedProposer.propose

    def spy(self, state, k):
        before = dict(self.choice.rounds)
        proposal = propose(self, state, k)
        source, = [s for s in before if self.choice.rounds[s] > before[s]]
        rounds.append((source, list(state.tokens), list(proposal.tokens), k))
        return proposal

    monkeypatch.setattr(LookupChainedProposer, "propose", spy)
    return rounds


@pytest.mark.parametrize("k", [1, 2, 4, 8, "auto"])
def test_lookup_chained_commits_the_greedy_stream(pair_engine, plain_greedy, monkeypatch, k):
    rounds = _recording(monkeypatch)
    engine = pair_engine()
    for prompt in ALL_PROMPTS:
        result = engine.generate(list(prompt), GenerationOptions(
            max_new_tokens=MAX_NEW, proposer="lookup_chained", k=k))
        assert result.token_ids == plain_greedy(prompt)
    sources = {source for source, *_ in rounds}
    assert CHAINED in sources and sources & {LOOKUP, LOOKUP1}, sources


def test_each_round_drafts_its_chosen_sources_drafts(pair_engine, monkeypatch):
    """A lookup round drafts the continuation of the last 2-3 tokens (``lookup``) or, where
    none recurs, of the last token (``lookup1``); a chained round drafts what the engine's
    chained drafter drafts from the same state."""
    rounds = _recording(monkeypatch)
    chained_calls: list[list[int]] = []
    chained_propose = ChainedProposer.propose

    def chained_spy(self, state, k):
        proposal = chained_propose(self, state, k)
        chained_calls.append(list(proposal.tokens))
        return proposal

    monkeypatch.setattr(ChainedProposer, "propose", chained_spy)
    engine = pair_engine()
    for prompt in ALL_PROMPTS:
        engine.generate(list(prompt), GenerationOptions(
            max_new_tokens=MAX_NEW, proposer="lookup_chained", k=4))
    chained = iter(chained_calls)
    for source, stream, drafts, k in rounds:
        long = NgramIndex(2, 3).drafts(stream, k)
        if source == LOOKUP:
            assert drafts == long and drafts
        elif source == LOOKUP1:
            assert not long and drafts == NgramIndex(1, 1).drafts(stream, k) and drafts
        else:
            assert drafts == next(chained)
    assert next(chained, None) is None  # the chained drafter ran in those rounds alone


def test_seeded_sampling_equals_plain_seeded_sampling(pair_engine):
    engine = pair_engine()
    for prompt in ALL_PROMPTS[:4]:
        options = dict(max_new_tokens=MAX_NEW, temperature=0.9, seed=7)
        plain = engine.generate(list(prompt), GenerationOptions(**options))
        spec = engine.generate(list(prompt), GenerationOptions(
            **options, proposer="lookup_chained", k=4))
        assert spec.token_ids == plain.token_ids


# -- the choice, on literal streams ----------------------------------------------------------
def test_a_continuation_is_scored_by_its_leading_matches_once_the_stream_decides():
    choice = SourceChoice(pending=[(3, [5, 6, 7], LOOKUP1)])
    choice.settle([1, 2, 3, 5, 6], passes=0)  # all known so far match: undecided
    assert choice.pending and choice.accepted[LOOKUP1] == PRIORS[LOOKUP1]
    choice.settle([1, 2, 3, 5, 6, 9], passes=0)  # the third draft would have been rejected
    assert not choice.pending
    assert choice.accepted[LOOKUP1] == pytest.approx(PRIORS[LOOKUP1] * (1 - WEIGHT) + 2 * WEIGHT)
    choice = SourceChoice(pending=[(2, [8, 8], LOOKUP)])
    choice.settle([1, 2, 4], passes=0)  # rejected at once: decided early
    assert choice.accepted[LOOKUP] == pytest.approx(PRIORS[LOOKUP] * (1 - WEIGHT))


def test_a_chained_round_is_scored_where_one_pass_ran_since():
    choice = SourceChoice(chained=(10, 4, 7))
    choice.settle(list(range(13)), passes=8)  # a = 3: two drafts accepted
    assert choice.accepted[CHAINED] == pytest.approx(PRIORS[CHAINED] * (1 - WEIGHT) + 2 * WEIGHT)
    choice = SourceChoice(chained=(10, 4, 7))
    choice.settle(list(range(13)), passes=9)  # a greedy step ran too: the advance is not a's
    assert choice.accepted[CHAINED] == PRIORS[CHAINED] and choice.chained is None


def test_the_best_average_drafts_and_lookup_wins_ties():
    choice = SourceChoice()
    assert choice.choose({LOOKUP: [1], LOOKUP1: []}) == LOOKUP  # a tie with the drafter
    assert choice.choose({LOOKUP: [], LOOKUP1: [1]}) == CHAINED  # the drafter's prior
    for _ in range(6):  # the drafter's rounds accept nothing; one-token lookups would 2
        choice.chained = (0, 4, 0)
        choice.settle([0], passes=1)
        choice.pending.append((0, [5, 6, 7], LOOKUP1))
        choice.settle([5, 6, 9], passes=0)
    assert choice.choose({LOOKUP1: [1]}) == LOOKUP1
    assert choice.choose({}) == CHAINED  # no continuation: the drafter
