"""The decode: prefill, then rounds until a stop rule fires (runtime.md §2.3, §14).

The loop invariant is :class:`~speculant.workflow.state.DecodeState`'s: between passes the
caches hold exactly the consumed positions and the pending token is the target's latest
choice. Everything a decode counts lands in ``state.stats``, returned with the state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from speculant.speculative.proposal import Proposer
from speculant.speculative.round import run_round
from speculant.workflow.sampler import choose
from speculant.workflow.state import DecodeState, RoundResult
from speculant.workflow.static_cells import StaticCells
from speculant.workflow.target_pass import PassResult, TargetPass


def decode(state: DecodeState, target: TargetPass, proposer: Proposer | None,
           k: int) -> Iterator[int]:
    """Yield each committed token as it is committed; ``state`` holds the rest."""
    # 1. Serving controls that say "inactive" or "done" get an empty result, no pass.
    if not state.is_active:
        state.stop("inactive")
        return
    # 2. Prefill: a pass over the prompt from empty caches; its last row gives the first
    #    token (argmax, or a draw from T(row)), which becomes pending.
    prefill = target.run(state.tokens, 0, state.cells, state.admitted, state.controls)
    last_row = state.seam.last_along_axis(prefill.logits, prefill.logits.rank - 2)  # [1,1,V]
    first, _ = choose(state.seam, state.sampler, last_row)
    yield from state.record_prefill(prefill, first)
    # 3. Rounds: propose, verify, then the state rolls back and commits with stop checks.
    if proposer is None and state.sampler is None and isinstance(state.cells, StaticCells):
        yield from greedy_ahead(state, target, target.ahead)
        return
    while not state.is_stopped:
        yield from state.record(run_round(state, target, proposer, k))


def greedy_ahead(state: DecodeState, target: TargetPass, depth: int) -> Iterator[int]:
    """Greedy steps on static caches with up to ``depth`` passes queued beyond the one the
    host reads: each pass's argmax [1] int32 stays where it was made and is the next pass's
    token there (``drafts``: runtime.md §17.4's in-place block), and its read-back (4 bytes)
    waits for that pass alone, so the device never waits for the host between tokens. The
    state records each as run_round's greedy step; a stop found while a pass is queued
    leaves that pass's slot past the length (rolled back like a rejected draft: 0 bytes)."""
    seam = state.seam
    queued: deque[tuple[PassResult, Callable[[], list[int]]]] = deque()
    start, choice = state.consumed, None  # choice [1] int32: the latest queued pass's argmax
    while not state.is_stopped:
        while len(queued) <= depth and state.capped_width(len(queued)) == len(queued):
            block = [state.pending] if choice is None else []  # the first from the host
            result = target.run(block, start, state.cells, state.admitted, state.controls,
                                drafts=choice)
            choice = seam.argmax_rows(seam.last_along_axis(result.logits,
                                                           result.logits.rank - 2))
            queued.append((result, seam.read_token_ids_later(choice)))
            start += 1
        result, read = queued.popleft()
        result.tokens = (state.pending,)  # what it consumed, known now
        yield from state.record(RoundResult(0, 1, read(), result))
