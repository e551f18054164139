"""The draft-model proposer (runtime.md §18): a second greedy decoder, its own caches and
consumed length, on the same verify / commit / rollback path.

The target is the fixture decoder (rollback_positions 8); the draft is the same fixture
function with other deviation positions (``DRAFT_SPEC``), so it disagrees with the target at
known positions. ``speculative_trace(..., proposer=DRAFT_SPEC)`` gives the exact (k_r, a_r)
trace, the drafts and every counter for each k.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from chain_helpers import MAX_NEW, PROBE_PROMPT, PROMPTS, SPEC
from proposer_helpers import DRAFT_DEVIATIONS, DRAFT_SPEC

import speculant
from builders import DEFAULT_DEVIATION_POSITIONS, speculative_trace
from speculant.errors import RequestError
from speculant.speculative.draft_model import DraftModelProposer

WIDTHS = (1, 2, 4, 8)
BOUND = 8  # rollback_positions of the target and the drafts (conftest.MAX_WIDTH)


@dataclass
class DraftRound:
    consumed: int  # C when the proposal started
    held_before: int  # D before the draft rolled back
    held_after_rollback: int  # D'
    held_after: int  # D after the proposal
    drafts: list[int]
    pass_sizes: list[int]  # tokens consumed by each draft-model pass
    draft_tokens: list[int]  # x[0..D) as the draft holds it afterwards
    stream: list[int]  # x[0..C] when the proposal started
    extents: dict[str, int]  # each draft cell's extent afterwards


def run_draft(engine, monkeypatch, prompt, k, max_new_tokens=MAX_NEW, **options):
    """One draft-model generate, recording every proposal."""
    rounds: list[DraftRound] = []
    propose, roll_back = DraftModelProposer.propose, DraftModelProposer._roll_back
    run = engine.draft.runner.run
    sizes: list[int] = []
    kept: list[int] = []

    def recording_roll_back(self, length):
        kept.append(min(length, len(self.tokens)))
        roll_back(self, length)

    def recording_run(tokens, start, cells, admitted, controls, **options):
        sizes.append(len(tokens))
        return run(tokens, start, cells, admitted, controls, **options)

    def recording_propose(self, state, width):
        sizes.clear()
        kept.clear()
        before, stream = len(self.tokens), list(state.tokens)
        proposal = propose(self, state, width)
        plan = self.model.package.plan
        rounds.append(DraftRound(
            state.consumed, before, kept[0], len(self.tokens), list(proposal.tokens),
            list(sizes), list(self.tokens), stream,
            {name: self.cells[name].shape[cell.sequence_axis]
             for name, cell in plan.cells.items()}))
        return proposal

    with monkeypatch.context() as mp:
        mp.setattr(DraftModelProposer, "propose", recording_propose)
        mp.setattr(DraftModelProposer, "_roll_back", recording_roll_back)
        mp.setattr(engine.draft.runner, "run", recording_run)
        result = engine.generate(list(prompt), max_new_tokens, proposer="draft", k=k,
                                 **options)
    return result, rounds


def expected(prompt, k, draft_spec=DRAFT_SPEC, max_new_tokens=MAX_NEW):
    return speculative_trace(SPEC, list(prompt), max_new_tokens, k, proposer=draft_spec,
                             rollback_bound=BOUND)


@pytest.mark.parametrize("k", WIDTHS)
def test_draft_model_equals_greedy_with_the_exact_trace(draft_engine, monkeypatch, k):
    """E1 and the exact trace: token for token the target's greedy stream; every round's
    (k_r, a_r), its drafts and every counter equal the reference's."""
    engine = draft_engine(deviation_positions=DRAFT_DEVIATIONS)
    outcomes = set()
    for prompt in PROMPTS:
        greedy = engine.generate(list(prompt), MAX_NEW).token_ids
        result, rounds = run_draft(engine, monkeypatch, prompt, k)
        trace = expected(prompt, k)
        assert result.token_ids == greedy == trace.tokens
        assert result.stats.trace == trace.pairs()
        assert [tuple(r.drafts) for r in rounds] == trace.drafts()
        counters = {name: getattr(result.stats, name) for name in trace.counters()}
        assert counters == trace.counters()
        assert result.stats.proposer == "draft"
        assert result.stats.proposer_invocations == result.stats.drafts_proposed  # k_r/round
        outcomes |= {a == k_r + 1 for k_r, a in result.stats.trace}
    assert outcomes == {True, False}  # full accepts and rollbacks both happen


@pytest.mark.parametrize("k", WIDTHS)
def test_draft_equal_to_the_target_accepts_every_draft(draft_engine, k):
    """A draft model computing exactly the target's function: every draft is accepted, bit
    for bit, greedy and sampled (p = q exactly, so u · q < p always holds)."""
    engine = draft_engine(deviation_positions=DEFAULT_DEVIATION_POSITIONS)
    for prompt in PROMPTS[:3]:
        greedy = engine.generate(list(prompt), MAX_NEW).token_ids
        for options in ({}, {"temperature": 3.0, "seed": 7}):
            result = engine.generate(list(prompt), MAX_NEW, proposer="draft", k=k, **options)
            stats = result.stats
            assert stats.rounds > 0 and stats.rollbacks == 0
            assert stats.accepted_drafts == stats.drafts_proposed
            assert stats.full_accepts == stats.rounds
            assert all(a == k_r + 1 for k_r, a in stats.trace)
            if not options:
                assert result.token_ids == greedy


@pytest.mark.parametrize("k", (2, 4, 8))
def test_draft_rolls_back_to_its_confirmed_prefix(draft_engine, monkeypatch, k):
    """The draft owns its caches: it starts each proposal from D' = C + min(a, k_r) of the
    previous round (= min(D, C')), its passes cover x[D'..C] then one draft each, it ends
    with D = C + k_r, its cells hold exactly D positions and its tokens are the stream's
    prefix followed by its drafts. A fully accepted block leaves it one token behind, so its
    next catch-up pass consumes two tokens."""
    engine = draft_engine(deviation_positions=DRAFT_DEVIATIONS)
    saw_bonus = saw_rollback = False
    for prompt in PROMPTS:
        result, rounds = run_draft(engine, monkeypatch, prompt, k)
        assert len(rounds) == len(result.stats.trace)
        for i, r in enumerate(rounds):
            k_r = len(r.drafts)
            if i == 0:
                assert r.held_before == r.held_after_rollback == 0  # empty caches
            else:
                previous, (prev_k, prev_a) = rounds[i - 1], result.stats.trace[i - 1]
                assert r.held_before == previous.consumed + prev_k
                assert r.held_after_rollback == previous.consumed + min(prev_a, prev_k)
                if prev_a == prev_k + 1:
                    saw_bonus = True
                    assert r.held_after_rollback == r.held_before  # nothing to roll back
                    assert k_r == 0 or r.pass_sizes[0] == 2  # one token behind: p and b[k_r]
                else:
                    saw_rollback = True
            if k_r:
                assert r.pass_sizes == [r.consumed + 1 - r.held_after_rollback] + [1] * (k_r - 1)
            assert r.held_after == r.consumed + k_r
            assert set(r.extents.values()) == {r.held_after}
            assert r.draft_tokens == r.stream[:r.consumed + 1] + r.drafts[:-1]
    assert saw_bonus and saw_rollback


def test_draft_context_cap_bounds_k(draft_engine, monkeypatch):
    """The draft's own context cap (16 here, the target's 64) caps k_r silently: its caches
    never exceed 15 positions; once C reaches 15 every round is a greedy step."""
    engine = draft_engine(deviation_positions={3, 9}, max_context=16)
    prompt = PROBE_PROMPT
    greedy = engine.generate(list(prompt), MAX_NEW).token_ids
    result, rounds = run_draft(engine, monkeypatch, prompt, 4)
    assert result.token_ids == greedy
    assert rounds and all(r.held_after <= 15 for r in rounds)
    assert all(len(r.drafts) == max(0, min(4, 15 - r.consumed)) for r in rounds)
    assert result.stats.greedy_steps >= MAX_NEW - 16


def test_draft_on_the_chained_pair(pair_root, draft_root):
    """The chained pair's target with a draft model beside it: all three proposers commit
    the target's greedy stream, each with its own figures."""
    engine = speculant.load(pair_root(), draft=draft_root(deviation_positions=DRAFT_DEVIATIONS))
    for prompt in PROMPTS[:3]:
        greedy = engine.generate(list(prompt), MAX_NEW).token_ids
        for proposer, invocations in (("chained", lambda k_r: k_r + 1),
                                      ("draft", lambda k_r: k_r),
                                      ("prompt_lookup", lambda k_r: 0)):
            result = engine.generate(list(prompt), MAX_NEW, proposer=proposer, k=4)
            assert result.token_ids == greedy, proposer
            assert result.stats.proposer == proposer
            assert result.stats.proposer_invocations == sum(
                invocations(k_r) for k_r, _ in result.stats.trace)
        trace = expected(prompt, 4)
        assert engine.generate(list(prompt), MAX_NEW, proposer="draft",
                               k=4).stats.trace == trace.pairs()


# -- bad input ---------------------------------------------------------------------------------
def test_draft_without_a_draft_model(decoder8_root):
    engine = speculant.load(decoder8_root)
    with pytest.raises(RequestError) as caught:
        engine.generate(list(PROBE_PROMPT), 8, proposer="draft", k=2)
    assert caught.value.paths == ["draft"]
    assert "draft=" in str(caught.value)


@pytest.mark.parametrize(("attribute", "what"), [("logits_width", "logits width"),
                                                 ("tokenizer_vocab", "tokenizer vocab_size")])
def test_draft_vocabulary_differs(decoder8_root, draft_root, attribute, what):
    """A draft whose vocabulary is not the target's: a RequestError naming both sizes."""
    engine = speculant.load(decoder8_root, draft=draft_root())
    setattr(engine.draft, attribute, 48)
    with pytest.raises(RequestError) as caught:
        engine.generate(list(PROBE_PROMPT), 8, proposer="draft", k=2)
    assert caught.value.paths == ["draft.vocab_size"]
    message = str(caught.value)
    assert what in message and "48" in message and "32" in message
    assert engine.generate(list(PROBE_PROMPT), 8).token_ids  # plain decoding still works


def test_draft_rollback_bound(decoder8_root, draft_root):
    """The draft must be able to roll back k - 1 positions."""
    engine = speculant.load(decoder8_root, draft=draft_root(rollback_positions=2))
    with pytest.raises(RequestError) as caught:
        engine.generate(list(PROBE_PROMPT), 8, proposer="draft", k=4)
    assert caught.value.paths == ["draft.rollback_positions"]
    assert "k = 4" in str(caught.value)
    assert engine.generate(list(PROBE_PROMPT), 8, proposer="draft", k=3).token_ids


@pytest.mark.parametrize("k", (0, 9))
def test_draft_k_outside_the_target_bound(draft_engine, k):
    with pytest.raises(RequestError) as caught:
        draft_engine().generate(list(PROBE_PROMPT), 8, proposer="draft", k=k)
    assert caught.value.paths == (["k"] if k == 0 else ["rollback_positions"])


def test_draft_k_defaults_to_the_kind_default(draft_engine):
    """k=None: the smaller of the target's rollback bound and the draft's own + 1."""
    engine = draft_engine()
    default = engine.generate(list(PROBE_PROMPT), 12, proposer="draft", k=None)
    bound = min(engine.package.plan.undeclared_rollback_bound,
                engine.draft.rollback_bound + 1)
    assert default.stats.trace == engine.generate(list(PROBE_PROMPT), 12, proposer="draft",
                                                  k=bound).stats.trace
    assert max(k_r for k_r, _ in default.stats.trace) == bound


def test_draft_refusing_the_prompt(draft_engine):
    """A prompt that fills the draft's (smaller) context: the draft's own admission error."""
    engine = draft_engine(deviation_positions={3, 9}, max_context=16)
    with pytest.raises(RequestError) as caught:
        engine.generate([5] * 20, 4, proposer="draft", k=2)
    assert caught.value.paths == ["draft"]
    assert "prompt fills the context" in str(caught.value)
