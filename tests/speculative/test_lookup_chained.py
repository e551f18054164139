"""``lookup_chained``: prompt lookup's drafts where a 2- or 3-gram of the stream recurs, the
chained drafter's elsewhere, chosen each round (speculative/lookup_chained.py). Its output
is the target's (greedy == plain greedy; seeded sampling == plain seeded sampling), and each
round drafts exactly what the rule names: the n-gram continuation, else the chained
drafter's own proposal from the same state."""

from __future__ import annotations

import pytest
from chain_helpers import MAX_NEW, PROMPTS
from test_prompt_lookup import REPETITIVE

from speculant import GenerationOptions
from speculant.speculative import lookup_chained
from speculant.speculative.chained import ChainedProposer
from speculant.speculative.lookup_chained import LookupChainedProposer
from speculant.speculative.prompt_lookup import NgramIndex

ALL_PROMPTS = (*PROMPTS, *REPETITIVE)


def _recording(monkeypatch) -> list[tuple[str, list[int], list[int], int]]:
    """Every round's (path, stream, drafts, k) as the proposer chose them."""
    rounds: list[tuple[str, list[int], list[int], int]] = []
    propose = LookupChainedProposer.propose

    def spy(self, state, k):
        before = self.lookup_rounds
        proposal = propose(self, state, k)
        path = "lookup" if self.lookup_rounds > before else "chained"
        rounds.append((path, list(state.tokens), list(proposal.tokens), k))
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
    paths = {path for path, *_ in rounds}
    assert paths == {"lookup", "chained"}, f"rounds drafted by {paths} only"


def test_each_round_drafts_what_the_rule_names(pair_engine, monkeypatch):
    """A round where a 2- or 3-gram recurs drafts its continuation; every other round drafts
    what the engine's chained drafter drafts from the same state."""
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
    for path, stream, drafts, k in rounds:
        expected = NgramIndex(2, 3).drafts(stream, k)
        if expected:
            assert (path, drafts) == ("lookup", expected)
        else:
            assert (path, drafts) == ("chained", next(chained))
    assert next(chained, None) is None  # the chained drafter ran in those rounds alone
    assert {path for path, *_ in rounds} == {"lookup", "chained"}


def test_a_single_token_match_is_not_drafted(pair_engine, monkeypatch):
    """The planted defect (lookup from 1-gram matches, prompt lookup's own range) drafts
    rounds the rule gives to the chained drafter, which the test above would catch."""
    rounds = _recording(monkeypatch)
    monkeypatch.setattr(lookup_chained, "MIN_MATCH", 1)
    engine = pair_engine()
    for prompt in ALL_PROMPTS:
        engine.generate(list(prompt), GenerationOptions(
            max_new_tokens=MAX_NEW, proposer="lookup_chained", k=4))
    assert any(path == "lookup" and not NgramIndex(2, 3).drafts(stream, k)
               for path, stream, _, k in rounds)


def test_seeded_sampling_equals_plain_seeded_sampling(pair_engine):
    engine = pair_engine()
    for prompt in ALL_PROMPTS[:4]:
        options = dict(max_new_tokens=MAX_NEW, temperature=0.9, seed=7)
        plain = engine.generate(list(prompt), GenerationOptions(**options))
        spec = engine.generate(list(prompt), GenerationOptions(
            **options, proposer="lookup_chained", k=4))
        assert spec.token_ids == plain.token_ids
