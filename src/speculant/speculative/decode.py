"""The decode: prefill, then rounds until a stop rule fires (runtime.md §2.3, §14).

The loop invariant is :class:`~speculant.workflow.state.DecodeState`'s: between passes the
caches hold exactly the consumed positions and the pending token is the target's latest
choice. Everything a decode counts lands in ``state.stats``, returned with the state.
"""

from __future__ import annotations

from collections.abc import Iterator

from speculant.speculative.ahead import greedy_ahead, rounds_ahead
from speculant.speculative.auto_k import AutoWidthProposer
from speculant.speculative.proposal import Proposer
from speculant.speculative.round import run_round
from speculant.workflow.sampler import choose
from speculant.workflow.state import DecodeState
from speculant.workflow.static_cells import StaticCells
from speculant.workflow.target_pass import TargetPass


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
    if isinstance(proposer, AutoWidthProposer) and not state.is_stopped:
        proposer.capture_widths(state, target)  # every width it may pick, before it picks
    # 3. Rounds: propose, verify, then the state rolls back and commits with stop checks;
    #    greedy on static caches the next pass or round is queued before the last is read
    #    (speculative/ahead.py).
    greedy_path = state.sampler is None and isinstance(state.cells, StaticCells)
    if proposer is None and greedy_path:
        yield from greedy_ahead(state, target, target.ahead)
        return
    queues = getattr(proposer, "queues", None)
    if target.ahead and not target.control_ports and queues is not None and queues(state):
        yield from rounds_ahead(state, target, proposer, k, target.ahead)
        return
    # k=auto's greedy stretches (speculative/auto_k.py) run on the greedy path where it runs
    auto = proposer if greedy_path and isinstance(proposer, AutoWidthProposer) else None
    while not state.is_stopped:
        yield from state.record(run_round(state, target, proposer, k))
        if auto is not None and not state.is_stopped and (steps := auto.greedy_stretch()):
            yield from greedy_ahead(state, target, target.ahead, steps)
