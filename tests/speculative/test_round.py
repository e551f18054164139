"""The round returns what happened (RoundResult) and changes nothing in the decode state; the
state records it in one place; the verifier is a pure function of its inputs."""

from __future__ import annotations

import dataclasses

import numpy as np
from chain_helpers import PROBE_PROMPT

from speculant.speculative.decode import alone
from speculant.speculative.round import launch_host_round
from speculant.speculative.verify import verify
from speculant.speculative.width import FixedWidth
from speculant.tensors import TensorSeam, Value
from speculant.tensors.sampling import Sampling
from speculant.workflow.sampler import Sampler
from speculant.workflow.state import RoundResult


def prefilled(engine, prompt=PROBE_PROMPT, max_new_tokens=20):
    state = engine.admit(list(prompt), max_new_tokens, proposer="chained", k=3)
    scheduler, entry = alone(state, engine.target, engine.proposer, FixedWidth(3))
    scheduler.step()  # the prefill: its token committed
    first, = entry.committed
    return state, first


def run_round(state, target, proposer, k):
    """One reference round of ``k`` drafts, launched and read at once."""
    width = state.capped_width(k)
    return launch_host_round(state, target, proposer, FixedWidth(width), width).read()


def snapshot(state):
    return (list(state.tokens), state.consumed, state.num_kept,
            {name: value.shape for name, value in state.cells.items()},
            dataclasses.asdict(state.stats))


def test_the_round_returns_a_value_and_leaves_the_state_alone(pair_engine):
    engine = pair_engine()
    state, _ = prefilled(engine)
    before = snapshot(state)
    result = run_round(state, engine.target, engine.proposer, 3)
    assert isinstance(result, RoundResult)
    assert snapshot(state) == before  # nothing recorded yet
    assert result.k == 3 and 1 <= result.num_accepted <= 4
    assert len(result.tokens) == result.num_accepted  # accepted drafts + correction/bonus
    assert result.verify_pass.start == state.consumed and len(result.verify_pass.tokens) == 4
    assert result.num_proposer_invocations == 4 and result.num_proposer_rows == 3


def test_the_state_records_a_round_in_one_place(pair_engine):
    engine = pair_engine()
    state, _ = prefilled(engine)
    consumed, committed = state.consumed, state.stats.committed
    result = run_round(state, engine.target, engine.proposer, 3)
    tokens = state.record(result)
    stats = state.stats
    assert tokens == result.tokens and state.tokens[-len(tokens):] == tokens
    assert state.consumed == consumed + result.num_accepted
    assert stats.rounds == 1 and stats.trace == [(3, result.num_accepted)]
    assert stats.target_passes == 2 and stats.proposer_invocations == 4
    assert stats.argmax_rows == 1 + 3 + 4  # prefill, the drafter's 3 rows, 4 verified rows
    assert stats.committed == committed + len(tokens)
    extents = {cell.sequence_axis: state.cells[name].shape[cell.sequence_axis]
               for name, cell in state.plan.cells.items()}
    assert set(extents.values()) == {state.consumed}


def test_after_pass_builds_the_chain_context_of_a_fresh_pass(pair_engine):
    from speculant.workflow.state import DecodeState

    engine = pair_engine()
    start = engine.admit(list(PROBE_PROMPT), 4)
    full = engine.target.run(list(PROBE_PROMPT), 0, start.cells, start.admitted, start.controls)
    state = DecodeState.after_pass(engine.seam, engine.package.plan, start.admitted,
                                   [*PROBE_PROMPT, 7], full, num_kept=2)
    assert state.consumed == 2 and state.latest is full and state.pending == 7
    assert all(value.shape[engine.package.plan.cells[name].sequence_axis] == 2
               for name, value in state.cells.items())
    assert len(engine.proposer.propose(state, 2).tokens) == 2


def test_verify_is_pure_on_literal_scores():
    seam = TensorSeam()
    logits = np.full((1, 4, 6), -1.0, np.float32)  # [1, k + 1, V]
    for row, token in enumerate((3, 4, 0, 5)):
        logits[0, row, token] = 1.0
    scores = Value.host(logits)
    copy = logits.copy()
    assert verify(seam, None, [2, 3, 4, 1], scores, None, 0) == (3, 0)  # d_3 = 1 rejected: 0
    assert verify(seam, None, [2, 3, 4, 0], scores, None, 0) == (4, 5)  # all accepted: bonus 5
    assert verify(seam, None, [2, 9, 4, 0], scores, None, 0) == (1, 3)  # d_1 rejected
    assert np.array_equal(logits, copy)


def test_keyed_verify_accepts_exactly_the_targets_draws():
    """Keyed sampling: row i's token is the Gumbel-max draw at position start + i + 1, and
    a draft is accepted exactly when it is that draw (greedy acceptance of the draws)."""
    seam = TensorSeam()
    scores = Value.host(np.random.default_rng(1).standard_normal((1, 4, 50)).astype(np.float32))
    sampler = Sampler(Sampling(1.5), seed=9)
    start = 17  # the pending token's position C
    draws = seam.read_token_ids(seam.sample_keyed(scores, sampler.params, sampler.key,
                                                  start + 1))  # [4]: positions C+1 … C+4
    assert verify(seam, sampler, [2, *draws[:3]], scores, None, start) == (4, draws[3])
    wrong = (draws[1] + 1) % 50
    assert verify(seam, sampler, [2, draws[0], wrong, draws[2]], scores, None, start) == \
        (2, draws[1])
    other = verify(seam, sampler, [2, *draws[:3]], scores, None, start + 1)  # shifted noise
    assert other != (4, draws[3])


def test_auto_resolves_by_the_auto_enable_rule(tmp_path):
    """``auto``: chained where every component's contract preserves the distribution, plain
    decoding otherwise; its fixed default k (k=None) is the chained kind's."""
    import speculant
    from builders.writers import write_chained_package

    safe = speculant.load(write_chained_package(tmp_path / "safe", equivalence="bitwise"))
    unsafe = speculant.load(write_chained_package(tmp_path / "unsafe"))
    auto = safe.generate(list(PROBE_PROMPT), 16, proposer="auto", k=None)
    assert auto.stats.proposer == "chained"
    assert auto.stats.trace == safe.generate(list(PROBE_PROMPT), 16, proposer="chained",
                                             k=None).stats.trace
    plain = unsafe.generate(list(PROBE_PROMPT), 16, proposer="auto")
    assert plain.stats.proposer is None and plain.stats.rounds == 0
    assert plain.token_ids == auto.token_ids
