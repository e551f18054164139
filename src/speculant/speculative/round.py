"""The speculative round: propose, verify in one target pass, accept, roll back, commit."""

from __future__ import annotations

from speculant.speculative.proposal import Proposal, Proposer
from speculant.speculative.verify import verify
from speculant.workflow.state import DecodeState
from speculant.workflow.target_pass import TargetPass

NO_DRAFTS = Proposal()


def run_round(state: DecodeState, target: TargetPass, proposer: Proposer | None,
              k: int) -> list[int]:
    """One round (runtime.md §14.1, §17, §18); returns the tokens it committed.

    The same round serves every proposer kind, greedy decoding and sampling. With no drafts
    (no proposer, no room left, or a proposer that found none) it is exactly a greedy step:
    the block is the pending token alone and the pass yields the next one.
    """
    stats = state.stats
    # 1. Width: k_r = min(k, budget − 1, context − L − 1); 0 makes this a greedy step.
    k_r = state.capped_width(k) if proposer is not None else 0
    # 2. Propose up to k_r drafts (and, when sampling, the distributions q they came from).
    proposal = proposer.propose(state, k_r) if proposer is not None and k_r > 0 else NO_DRAFTS
    k_r = proposal.k  # a proposer may find fewer (prompt lookup: maybe none)
    block = [state.pending, *proposal.tokens]  # the pending token at C, drafts at C+1 … C+k_r
    # 3. Verify: the round's only target pass; row i scores the token after block[0..i].
    vp = target.run(block, state.consumed, state.cells, state.admitted)
    stats.target_passes += 1
    # 4. Accept (greedy or rejection sampling): block[1..a) are accepted drafts, `last` is
    #    the correction (a <= k_r) or the bonus (a = k_r + 1).
    a, last = verify(state.seam, state.sampler, block, vp.logits, proposal.probs, stats)
    if k_r > 0:
        stats.record_round(k_r, a, len(state.plan.rollback_state))
    else:
        stats.greedy_steps += 1
    # 5. Roll back every rollback_state cell to C + a; the chain context becomes (vp, a).
    #    (A proposer with caches of its own rolls them back itself, before it next proposes.)
    state.advance(vp, a)
    # 6. Commit the accepted drafts and `last`, one at a time, with stop checks.
    return state.commit([*block[1:a], last])
