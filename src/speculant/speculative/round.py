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
from speculant.speculative.width import WidthPolicy
from speculant.tensors import Value
from speculant.workflow.state import DecodeState, RoundResult
from speculant.workflow.target_pass import UNREAD, TargetPass, capture_widths, resolved


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
                                         proposal.probs, state.consumed, state.constraint,
                                         verify_pass.argmax)
            return _result(proposal, num_accepted, [*block[1:num_accepted], token],
                           replace(verify_pass, tokens=tuple(block)))
        assert state.constraint is None  # a grammar's drafts are chosen on the host
        num_accepted, committed = verify_in_place(state.seam, proposal.drafts,
                                                  verify_pass.logits)  # a and ids read back
        tokens = (block[0], *committed[:-1], *verify_pass.tokens[num_accepted:])
        return _result(proposal, num_accepted, committed, replace(verify_pass, tokens=tokens))

    return LaunchedRound(HOST_ROUNDS, proposal.k, read)


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
    every one launched the same way, and every token they may commit within the budget.
    The scheduler fills it before its step's pass and reads one round after (a row of a
    batched step: depth 0, one host round of the step's width)."""

    def __init__(self, state: DecodeState, proposer: Proposer | None, policy: WidthPolicy,
                 route: Route, device: str | None = None) -> None:
        """``device``: where a queued route's cursor lives (its target's)."""
        self.state, self.proposer, self.policy, self.route = state, proposer, policy, route
        self.widest = policy.widths[-1] if proposer is not None else 0
        self.launched: deque[LaunchedRound] = deque()
        self._held: int | None = None  # a width chosen that waits for the queue to drain
        self._cursor = (state.seam.zeros((1,), "int32", device)
                        if route.rounds == QUEUED_ROUNDS else None)  # [1] int32: the next C

    def fill(self, target: TargetPass, k: int | None = None,
             proposer: Proposer | None = None) -> None:
        """Launch into ``target`` what the queue has room for (at least one round where none
        is launched): the first with ``k`` drafts of ``proposer`` where given (a batched
        step's width, its drafts made with the other rows'), the rest at the policy's."""
        while len(self.launched) <= self.route.depth and self._launch(target, k, proposer):
            k = proposer = None

    def read(self) -> RoundResult:
        """The oldest round launched, read."""
        return self.launched.popleft().read()

    def _launch(self, target: TargetPass, chosen: int | None,
                proposer: Proposer | None) -> bool:
        state, launched = self.state, self.launched
        ahead = sum(r.k + 1 for r in launched)  # tokens the unread rounds may commit first
        if launched and (state.room(ahead) < 1 or
                         state.capped_width(self.widest, ahead) < self.widest):
            return False  # too near the end to launch at full width before reading
        k = chosen if chosen is not None else self._held if self._held is not None else \
            self.policy.width(state, state.capped_width(self.widest, ahead))
        how = self.route.rounds if k or not self.route.has_steps_in_place else STEPS
        if launched and (how == HOST_ROUNDS or how != launched[-1].how):
            self._held = k  # launched once the rounds before it are read
            return False
        self._held = None
        behind = launched[-1] if launched else None
        if how == STEPS:
            round_ = launch_step(state, target, self.policy, behind, state.consumed + ahead)
        elif how == QUEUED_ROUNDS:
            round_ = launch_queued_round(state, target, self.proposer, self.policy, k,
                                         behind, self._cursor, ahead)
        else:
            round_ = launch_host_round(state, target, proposer or self.proposer, self.policy,
                                       k)
        launched.append(round_)
        return True


def warm_up(state: DecodeState, target: TargetPass, proposer: Proposer | None,
            policy: WidthPolicy) -> None:
    """Where passes replay captured CUDA graphs: the target's plan of every block width the
    policy may verify and the proposer's plans of every width it may propose, captured now
    (a capture mid-decode stalls it); then, for a measured policy, one timed proposal of each
    width (an unmeasured width looks free). The one place a lone decode's plans are made
    ahead (a batched target plans per step shape: workflow/batched_pass.py)."""
    cells = state.cells
    widths = [k for k in policy.widths if k <= state.capped_width(k)]
    if not cells.is_in_place or not target.session.graphs.is_enabled or all(
            k + 1 in cells.plans and not cells.plans[k + 1].awaits_capture for k in widths):
        return
    capture_widths(target, [k + 1 for k in widths], state.pending, state.consumed, cells,
                   state.admitted, state.controls)
    drafted = [k for k in widths if k]
    if proposer is None or not drafted or (capture := getattr(proposer, "capture_widths",
                                                              None)) is None:
        return
    capture(state, drafted)
    timed = getattr(policy, "timed_warm_up", None)
    draws_none = state.sampler is None or state.sampler.is_keyed  # no generator to advance
    for k in drafted if timed is not None and draws_none else ():
        started = time.perf_counter()
        proposal = proposer.propose(state, k)
        timed(proposal.k, time.perf_counter() - started)
