"""The speculative round: propose, verify in one target pass, accept, roll back, commit."""

from __future__ import annotations

from typing import Protocol

from speculant.speculative.verify import greedy_accept
from speculant.workflow.state import DecodeState
from speculant.workflow.target_pass import TargetPass


class Proposer(Protocol):
    def propose(self, state: DecodeState, k: int) -> list[int]:
        """``k`` drafts for block positions 1 … k, from the state's chain context."""
        ...


def run_round(state: DecodeState, target: TargetPass, proposer: Proposer | None,
              k: int) -> list[int]:
    """One round (runtime.md §14.1); returns the tokens it committed.

    With ``k_r = 0`` (no proposer, or no room left) it is exactly a greedy step: the block is
    the pending token alone and the pass yields the next one.
    """
    seam, stats = state.seam, state.stats
    # 1. Width: k_r = min(k, budget − 1, context − L − 1); 0 makes this a greedy step.
    k_r = state.capped_width(k) if proposer is not None else 0
    # 2. Propose k_r drafts from the chain context (the latest pass, keep).
    drafts = proposer.propose(state, k_r) if proposer is not None and k_r > 0 else []
    block = [state.pending, *drafts]  # the pending token at C, drafts at C+1 … C+k_r
    # 3. Verify: the round's only target pass; t[i] = the target's choice after block[0..i).
    vp = target.run(block, state.consumed, state.cells, state.admitted)
    target_ids = seam.read_token_ids(seam.argmax_rows(vp.logits))  # k_r + 1 ids, 4 bytes each
    t = [state.pending, *target_ids]
    stats.target_passes += 1
    stats.argmax_rows += k_r + 1
    # 4. Accept: block[1..a) are confirmed drafts; t[a] is the correction or the bonus.
    a = greedy_accept(block, t)
    if k_r > 0:
        stats.record_round(k_r, a, len(state.plan.rollback_state))
    else:
        stats.greedy_steps += 1
    # 5. Roll back every rollback_state cell to C + a; the chain context becomes (vp, a).
    state.advance(vp, a)
    # 6. Commit the accepted drafts and t[a], one at a time, with stop checks.
    return state.commit([*block[1:a], t[a]])
