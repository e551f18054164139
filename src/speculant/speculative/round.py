"""The speculative round: propose, verify in one target pass; it returns what happened and
the decode state records it (rollback and commit have one home: workflow/state.py)."""

from __future__ import annotations

from speculant.speculative.proposal import Proposal, Proposer
from speculant.speculative.verify import verify, verify_in_place
from speculant.workflow.state import DecodeState, RoundResult
from speculant.workflow.target_pass import TargetPass

NO_DRAFTS = Proposal()


def run_round(state: DecodeState, target: TargetPass, proposer: Proposer | None,
              k: int) -> RoundResult:
    """One round (runtime.md §14.1, §17, §18). Reads the state; changes nothing in it but
    the request's generator (its draws).

    The same round serves every proposer kind, greedy decoding and sampling. With no drafts
    (no proposer, no room left, or a proposer that found none) it is exactly a greedy step:
    the block is the pending token alone and the pass yields the next one.
    """
    # 1. Width: k_r = min(k, budget − 1, context − L − 1); 0 makes this a greedy step.
    k_r = state.capped_width(k) if proposer is not None else 0
    # 2. Propose up to k_r drafts (and, when sampling, the distributions q they came from).
    proposal = proposer.propose(state, k_r) if proposer is not None and k_r > 0 else NO_DRAFTS
    block = [state.pending, *proposal.tokens]  # the pending token at C, drafts at C+1 … C+k_r
    # 3. Verify: the round's only target pass; row i scores the token after block[0..i]
    #    (drafts kept where they were made complete the block there).
    verify_pass = target.run(block, state.consumed, state.cells, state.admitted,
                             state.controls, drafts=proposal.drafts)
    # 4. Accept (greedy or rejection sampling): block[1..a) are accepted drafts, then the
    #    correction (a <= k_r) or the bonus (a = k_r + 1).
    if proposal.drafts is None:
        num_accepted, token = verify(state.seam, state.sampler, block, verify_pass.logits,
                                     proposal.probs)
        committed = [*block[1:num_accepted], token]
    else:  # in place: only a and the committed ids are read back
        num_accepted, committed = verify_in_place(state.seam, proposal.drafts,
                                                  verify_pass.logits)
        verify_pass.tokens = (block[0], *committed[:-1], *verify_pass.tokens[num_accepted:])
    # 5. The state rolls every rollback_state cell back to C + a and commits the tokens
    #    (state.record). A proposer with caches of its own rolls them back itself, before
    #    it next proposes.
    return RoundResult(proposal.k, num_accepted, committed, verify_pass,
                       proposal.num_invocations, proposal.num_scored_rows)
