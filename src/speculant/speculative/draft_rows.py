"""The draft model at ``B`` rows: every row of a scheduler step that speculates with a draft
model whose package has a batched graph is drafted by one batched pass of that graph per
draft step (docs/design/batching.md, "The draft model's rows").

The draft's batched buffers ``[B, KV, capacity, d]`` have the scheduler's rows, and a
request's row of them is its row of the target's (``state.cells.row``: taken when the request
takes its row, free when it leaves). What is the request's own is its draft length ``D`` —
the slots ``[0, D)`` of its row hold ``x[0..D)`` — kept in a :class:`DraftRow` from its
admission (the draft side's checks, as batch 1's) for as long as its row reservation lives.
A round's proposal is the batch-1 draft model's (speculative/draft_model.py, its module says
why): roll back to ``D'``, the slots that still hold the stream (``min(D, C)`` after a round
that verified its drafts; ``kept_length``) — a length, zero bytes —, one pass over the unconsumed
``x[D'..C]`` whose last row gives ``d_1``, then ``k − 1`` one-token passes, after which
``D = C + k``. Here every drafting row's catch-up block ``x[D'_b..C_b]`` runs in one batched
pass (right-padded, each row's ``block_lengths`` its own width, its cursor its own ``D'_b``),
and each further draft step is one batched pass of the rows still drafting: rows of
different ``k`` run to the widest and each stops at its own. Invariant: row ``b``'s passes
write the slots ``[D'_b, C_b + k_b)`` of row ``b`` and read ``[0, C_b + k_b)`` of it, and
nothing else, so its drafts are the drafts it makes alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from weakref import WeakKeyDictionary

from speculant.errors import SpeculantError
from speculant.speculative.draft_model import DraftModel, kept_length
from speculant.speculative.proposal import Proposal
from speculant.tensors import Value
from speculant.workflow.batched_pass import RowBlock, open_batched_pass
from speculant.workflow.cells import RowCells, request_capacity
from speculant.workflow.request import Admitted, Request
from speculant.workflow.sampler import choose
from speculant.workflow.state import DecodeState
from speculant.workflow.target_pass import PassResult


@dataclass
class DraftRow:
    """One request's part of the draft's rows: its admission on the draft side (its context
    cap) and its draft length ``D``."""

    admitted: Admitted
    length: int = 0  # D: the slots [0, D) of the request's row of the draft's buffers
    held: tuple[int, ...] = ()  # the drafts its last proposal consumed: slots [D - len, D)


def can_draft_rows(model: DraftModel | None, rows: int) -> bool:
    """Whether there is a draft model whose package has a batched graph of at least ``rows``
    rows (otherwise its rows draft one by one, each with caches of its own)."""
    static = model.package.plan.static if model is not None else None
    return static is not None and static.batch is not None and static.batch.max_rows >= \
        rows and model is not None and model.package.batched_artifact is not None


class DraftRows:
    """Drafts for the draft-model rows of a step, one batched pass per draft step (see the
    module); ``propose`` is one row's alone, through the same passes."""

    def __init__(self, model: DraftModel, rows: int) -> None:
        """``rows``: the scheduler's (:func:`can_draft_rows` holds)."""
        self.model, self.seam = model, model.seam
        self.target = open_batched_pass(model.package, model.make_session, rows,
                                        model.session)
        self.rows: WeakKeyDictionary[RowCells, DraftRow] = WeakKeyDictionary()

    def start(self, row: RowCells, request: Request, k: int, *,
              target_logits_width: int | None,
              target_tokenizer_vocab: int | None) -> DraftRows:
        """Admit ``request``, reserved ``row`` of the target's caches, on the draft side
        (:meth:`DraftModel.admit`, and its bound ``P + max_new_tokens + k + 1`` within the
        draft's caches, as batch 1's); its draft length starts at 0."""
        admitted = self.model.admit(request, k, target_logits_width=target_logits_width,
                                    target_tokenizer_vocab=target_tokenizer_vocab)
        request_capacity(self.model.package.plan, len(request.prompt_ids),
                         request.options.max_new_tokens, k, what="draft model's request")
        self.rows[row] = DraftRow(admitted)
        return self

    def propose(self, state: DecodeState, k: int) -> Proposal:
        """``k`` drafts for one row (the Proposer protocol), by the rows' passes."""
        result = self.propose_rows([(state, k)])[0]
        if isinstance(result, SpeculantError):
            raise result
        return result

    def propose_rows(self, requests: Sequence[tuple[DecodeState, int]]
                     ) -> list[Proposal | SpeculantError]:
        """Each request's drafts (``k >= 1``, its row taken), capped by the draft's context
        as alone; a failed pass raises for every row. Pass ``j`` gives row ``b``'s draft
        ``j`` where ``j <= k_b``: its argmax, or under sampling its draw at position
        ``C + j`` (``q_j`` kept for rejection sampling), as alone."""
        seam = self.seam
        results: list[Proposal | SpeculantError] = [Proposal() for _ in requests]
        drafting: list[tuple[int, DecodeState, DraftRow, int]] = []  # (request, state, row, k)
        for i, (state, k) in enumerate(requests):
            row = self.rows[state.cells]  # the rollback, a length: D' (kept_length)
            row.length = kept_length(row.length - len(row.held), row.held, state)
            row.held = ()
            cap = row.admitted.context_cap
            if cap is not None:  # its caches may reach extent cap - 1, as alone
                k = min(k, cap - 1 - state.consumed)
            if k > 0:
                drafting.append((i, state, row, k))
        if not drafting:
            return results
        self.target.fit(max(state.cells.capacity for _, state, _, _ in drafting))
        blocks = {i: RowBlock(tuple(state.tokens[row.length:state.consumed + 1]), row.length,
                              state.cells) for i, state, row, _ in drafting}  # x[D'..C]
        drafts: dict[int, list[int]] = {i: [] for i, *_ in drafting}
        probs: dict[int, list[Value]] = {i: [] for i, *_ in drafting}
        for j in range(1, max(k for *_, k in drafting) + 1):
            live = [(i, state, row) for i, state, row, k in drafting if j <= k]
            passes = self._run([blocks[i] for i, _, _ in live])
            for (i, state, row), result in zip(live, passes, strict=True):
                row.length += len(result.tokens)
                scores = seam.last_along_axis(result.logits, result.logits.rank - 2)
                draft, q = choose(seam, state.sampler, scores, state.consumed + j)
                drafts[i].append(draft)
                if q is not None:
                    probs[i].append(q)
                blocks[i] = RowBlock((draft,), row.length, state.cells)
        for i, _, row, k in drafting:
            row.held = tuple(drafts[i][:-1])  # d_k is never consumed
            results[i] = Proposal(drafts[i], probs[i] or None, num_invocations=k,
                                  num_scored_rows=k)
        return results

    def _run(self, blocks: Sequence[RowBlock]) -> list[PassResult]:
        """The blocks' passes, in one batched pass where every row's window ``[D_b, D_b +
        W)`` fits its row (the graph writes the whole window); otherwise the rows it fits
        first, the others after (only near the caches' capacity: a wide catch-up beside a
        row close to its end)."""
        done: dict[int, PassResult] = {}
        left = list(blocks)
        while left:
            width = max(len(block.tokens) for block in left)
            fits = [block for block in left if block.start + width <= self.target.capacity
                    ] or left  # none: the pass names the rows past their capacity
            done.update(zip(map(id, fits), self.target.run(fits), strict=True))
            left = [block for block in left if id(block) not in done]
        return [done[id(block)] for block in blocks]
