"""Passes queued on the device before the host reads the last one (issue 12, item 4).

On a device the host's work per round (reading back, recording, choosing the next width,
writing the next inputs) would leave the device idle between passes. Here the next pass is
queued first and the last is read after:

* :func:`greedy_ahead`: each greedy pass's argmax stays where it was made and is the next
  pass's token there;
* :func:`rounds_ahead`: a chained round is queued behind the last one before that one is
  read. Its start ``C`` (``cursor`` [1] int32), ``s``, ``p``, ``carry_0`` and the drafter's
  positions and length are advanced where the round runs from the last round's acceptance
  ``[a, c_1 …]`` (``ChainedProposer.propose_after``: tensors/seam_cursor.py's writes); the
  verify pass writes its positions and length from the cursor (``TargetPass.run(at=)``).

The host then reads each round's ``[a, c_1 … c_{k+1}]`` (4 (k + 2) bytes) and the decode
state records it as the round it is. A round is queued only while every token it can commit
fits the budget and the caches (``DecodeState.capped_width(k, ahead=)``); near the end the
rounds run one at a time again. A stop found while rounds are queued leaves their slots past
the length (rolled back like rejected drafts: 0 bytes), and their counts are never read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from speculant.speculative.proposal import QueuedRound, QueuingProposer
from speculant.speculative.round import run_round
from speculant.workflow.state import DecodeState, RoundResult
from speculant.workflow.target_pass import UNREAD, PassResult, TargetPass


def greedy_ahead(state: DecodeState, target: TargetPass, depth: int,
                 steps: int | None = None) -> Iterator[int]:
    """Greedy steps on static caches (``steps`` of them, None: to the end) with up to
    ``depth`` passes queued beyond the one the host reads: each pass's argmax [1] int32 stays
    where it was made and is the next pass's token there (``drafts``: runtime.md §17.4's
    in-place block), and its read-back (4 bytes) waits for that pass alone, so the device
    never waits for the host between tokens. The state records each as run_round's greedy
    step."""
    seam = state.seam
    queued: deque[tuple[PassResult, Callable[[], list[int]], bool]] = deque()
    start, choice = state.consumed, None  # choice [1] int32: the latest queued pass's argmax
    end = None if steps is None else start + steps  # the first position not to run
    while not state.is_stopped and (queued or start != end):
        while len(queued) <= depth and start != end and \
                state.capped_width(len(queued)) == len(queued):
            block = [state.pending] if choice is None else []  # the first from the host
            result = target.run(block, start, state.cells, state.admitted, state.controls,
                                drafts=choice)
            choice = seam.argmax_rows(seam.last_along_axis(result.logits,
                                                           result.logits.rank - 2))
            queued.append((result, seam.read_token_ids_later(choice), bool(queued)))
            start += 1
        result, read, is_queued = queued.popleft()
        result.tokens = (state.pending,)  # what it consumed, known now
        yield from state.record(RoundResult(0, 1, read(), result, is_queued=is_queued))


def rounds_ahead(state: DecodeState, target: TargetPass, proposer: QueuingProposer, k: int,
                 depth: int) -> Iterator[int]:
    """Greedy speculative rounds with up to ``depth`` rounds queued beyond the one the host
    reads (see the module)."""
    seam = state.seam
    queued: deque[QueuedRound] = deque()
    cursor = seam.zeros((1,), "int32", target.session.device)  # [1] int32: the next C
    while not state.is_stopped:
        while len(queued) <= depth:
            ahead = sum(r.k + 1 for r in queued)  # tokens the unread rounds may commit first
            if state.capped_width(k, ahead=ahead) != k:
                break
            after = queued[-1] if queued else None
            if after is None:
                seam.write_ints(cursor, [state.consumed])  # the state's, read
            else:
                seam.add_first(cursor, after.counted)  # C + a, where a is
            proposal = proposer.propose_after(state, after, cursor, k)
            verify = target.run([], state.consumed + ahead, state.cells, state.admitted,
                                state.controls, drafts=proposal.block, at=cursor)
            assert proposal.drafts is not None
            counted = seam.accept_greedy(proposal.drafts, seam.argmax_rows(verify.logits))
            queued.append(QueuedRound(proposal.k, verify, counted,
                                      seam.read_token_ids_later(counted),
                                      proposal.num_invocations, proposal.num_scored_rows,
                                      after is not None))
        if not queued:  # too near the end to queue: one round at a time
            yield from state.record(run_round(state, target, proposer, k))
            continue
        done = queued.popleft()
        num_accepted, *choices = done.read()
        committed = choices[:num_accepted]
        done.verify.start = state.consumed  # known now, as are the tokens it consumed
        done.verify.tokens = (state.pending, *committed[:-1],
                              *[UNREAD] * (done.k + 1 - num_accepted))
        yield from state.record(RoundResult(done.k, num_accepted, committed, done.verify,
                                            done.num_proposer_invocations,
                                            done.num_proposer_rows, done.is_queued))
