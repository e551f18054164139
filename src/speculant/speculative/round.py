"""The round — propose, verify in one target pass, accept — launched, then read.

Launching proposes the drafts and queues the target pass (and, where the drafts stay on the
device, counts their acceptance there); reading returns the :class:`RoundResult`, which only
the decode state records. The decode reads each round before it launches the next at queue
depth 0, the reference; deeper, rounds are launched behind ones not read yet. The three
launches (``host``, ``step``, ``queued``) and the route that picks them:
docs/design/speculative.md.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace

from speculant.speculative.proposal import (
    HOST_ROUNDS,
    NO_DRAFTS,
    QUEUED_ROUNDS,
    STEPS,
    LaunchedRound,
    Proposal,
    Proposer,
)
from speculant.speculative.verify import verify, verify_in_place
from speculant.speculative.width import FixedWidth, WidthPolicy
from speculant.tensors import Value
from speculant.workflow.state import DecodeState, RoundResult
from speculant.workflow.target_pass import UNREAD, TargetPass, resolved


@dataclass(frozen=True)
class Route:
    """How a decode's rounds run, chosen once at admission (``--stats`` prints ``reason``):
    the launch of its rounds with drafts, whether its greedy steps stay on the device, and
    how many rounds may be launched beyond the one the host reads."""

    rounds: str  # HOST_ROUNDS or QUEUED_ROUNDS
    has_steps_in_place: bool  # a greedy step (k = 0) keeps its argmax where it was made
    depth: int  # rounds launched beyond the one read (0: the reference)
    reason: str


def launch_host_round(state: DecodeState, target: TargetPass, proposer: Proposer | None,
                      policy: WidthPolicy, k: int) -> LaunchedRound:
    """Steps 1–3 of the reference round; its read is step 4, acceptance. ``target`` may be
    a row's of a batched step (speculative/scheduler.py): its pass then runs with the other
    rows', and is read once that one pass has run."""
    # 1. Propose up to k drafts (and, under rejection sampling, the distributions q they
    #    came from).
    started = time.perf_counter()
    proposal = proposer.propose(state, k) if proposer is not None and k else NO_DRAFTS
    policy.proposed(proposal.k, time.perf_counter() - started)
    block = [state.pending, *proposal.tokens]  # the pending token at C, drafts at C+1 … C+k
    # 2. Verify: the round's only target pass; row i scores the token after block[0..i]
    #    (drafts kept where they were made complete the block there).
    launched = target.run(block, state.consumed, state.cells, state.admitted,
                          state.controls, drafts=proposal.drafts)  # a row's: run with others

    def read() -> RoundResult:
        verify_pass = resolved(launched)
        # 3. Accept (the target's argmax or keyed draw per row, or rejection sampling):
        #    block[1..a) are accepted drafts, then the correction (a <= k) or the bonus.
        if proposal.drafts is None:  # drafts on the host (always under a grammar)
            num_accepted, token = verify(state.seam, state.sampler, block, verify_pass.logits,
                                         proposal.probs, state.consumed, state.constraint)
            return _result(proposal, num_accepted, [*block[1:num_accepted], token],
                           replace(verify_pass, tokens=tuple(block)))
        assert state.constraint is None  # a grammar's drafts are chosen on the host
        num_accepted, committed = verify_in_place(state.seam, proposal.drafts,
                                                  verify_pass.logits)  # a and ids read back
        tokens = (block[0], *committed[:-1], *verify_pass.tokens[num_accepted:])
        return _result(proposal, num_accepted, committed, replace(verify_pass, tokens=tokens))

    return LaunchedRound(HOST_ROUNDS, proposal.k, read)


def run_round(state: DecodeState, target: TargetPass, proposer: Proposer | None,
              k: int) -> RoundResult:
    """One reference round of ``k`` drafts, launched and read at once (the decode at queue
    depth 0); it changes nothing in the state but the request's generator (its draws)."""
    width = state.capped_width(k) if proposer is not None else 0
    return launch_host_round(state, target, proposer, FixedWidth(width), width).read()


def launch_step(state: DecodeState, target: TargetPass, policy: WidthPolicy,
                behind: LaunchedRound | None, start: int) -> LaunchedRound:
    """A greedy step at ``start`` on static caches: its token is the pending one (``behind``
    None) or the argmax of the step queued before it, where that was made; its own argmax
    stays there too, and is read back (4 bytes) when the step is read."""
    policy.proposed(0, 0.0)
    seam = state.seam
    result = target.run([] if behind else [state.pending], start, state.cells,
                        state.admitted, state.controls,
                        drafts=behind.choice if behind else None)
    choice = seam.argmax_rows(seam.last_along_axis(result.logits, result.logits.rank - 2))
    read_choice = seam.read_token_ids_later(choice)
    is_queued = behind is not None

    def read() -> RoundResult:
        consumed = replace(result, tokens=(state.pending,))  # what it consumed, known now
        return RoundResult(0, 1, read_choice(), consumed, is_queued=is_queued)

    return LaunchedRound(STEPS, 0, read, choice=choice)


def launch_queued_round(state: DecodeState, target: TargetPass, proposer: Proposer,
                        policy: WidthPolicy, k: int, behind: LaunchedRound | None,
                        cursor: Value, ahead: int) -> LaunchedRound:
    """A greedy chained round launched behind ``behind`` (None: behind the state's latest
    round, read): ``cursor`` becomes its start ``C`` where it runs, its proposal is advanced
    there from ``behind``'s count, and its acceptance is counted there."""
    seam = state.seam
    if behind is None:
        seam.write_ints(cursor, [state.consumed])  # the state's, read
    else:
        seam.add_first(cursor, behind.counted)  # C + a, where a is
    started = time.perf_counter()
    proposal = proposer.propose_after(state, behind, cursor, k)
    policy.proposed(proposal.k, time.perf_counter() - started)
    verify_pass = target.run([], state.consumed + ahead, state.cells, state.admitted,
                             state.controls, drafts=proposal.block, at=cursor)
    assert proposal.drafts is not None
    counted = seam.accept_greedy(proposal.drafts, seam.argmax_rows(verify_pass.logits))
    read_counted = seam.read_token_ids_later(counted)
    is_queued = behind is not None

    def read() -> RoundResult:
        num_accepted, *choices = read_counted()
        committed = choices[:num_accepted]
        tokens = (state.pending, *committed[:-1], *[UNREAD] * (proposal.k + 1 - num_accepted))
        read_pass = replace(verify_pass, start=state.consumed, tokens=tokens)  # known now
        return _result(proposal, num_accepted, committed, read_pass, is_queued)

    return LaunchedRound(QUEUED_ROUNDS, proposal.k, read, verify_pass, counted)


def _result(proposal: Proposal, num_accepted: int, committed: list[int], verify_pass,
            is_queued: bool = False) -> RoundResult:
    return RoundResult(proposal.k, num_accepted, committed, verify_pass,
                       proposal.num_invocations, proposal.num_scored_rows, is_queued)


class Rounds:
    """One decode's rounds launched and not read yet, oldest first: at most ``depth + 1``,
    every one launched the same way, and every token they may commit within the budget."""

    def __init__(self, state: DecodeState, target: TargetPass, proposer: Proposer | None,
                 policy: WidthPolicy, route: Route) -> None:
        self.state, self.target, self.proposer = state, target, proposer
        self.policy, self.route = policy, route
        self.widest = policy.widths[-1] if proposer is not None else 0
        self.launched: deque[LaunchedRound] = deque()
        self._held: int | None = None  # a width chosen that waits for the queue to drain
        self._cursor = (state.seam.zeros((1,), "int32", target.session.device)
                        if route.rounds == QUEUED_ROUNDS else None)  # [1] int32: the next C

    def read_next(self) -> RoundResult:
        """Launch what the queue has room for, then read the oldest round."""
        while len(self.launched) <= self.route.depth and self._launch():
            pass
        return self.launched.popleft().read()

    def _launch(self) -> bool:
        state, launched = self.state, self.launched
        ahead = sum(r.k + 1 for r in launched)  # tokens the unread rounds may commit first
        if launched and (state.room(ahead) < 1 or
                         state.capped_width(self.widest, ahead) < self.widest):
            return False  # too near the end to launch at full width before reading
        k = self._held if self._held is not None else self.policy.width(
            state, state.capped_width(self.widest, ahead))
        how = self.route.rounds if k or not self.route.has_steps_in_place else STEPS
        if launched and (how == HOST_ROUNDS or how != launched[-1].how):
            self._held = k  # launched once the rounds before it are read
            return False
        self._held = None
        behind = launched[-1] if launched else None
        if how == STEPS:
            round_ = launch_step(state, self.target, self.policy, behind,
                                 state.consumed + ahead)
        elif how == QUEUED_ROUNDS:
            round_ = launch_queued_round(state, self.target, self.proposer, self.policy, k,
                                         behind, self._cursor, ahead)
        else:
            round_ = launch_host_round(state, self.target, self.proposer, self.policy, k)
        launched.append(round_)
        return True
