"""The chained drafter at ``B`` rows: every row of a scheduler step that speculates with it is
drafted by one run of the step graph per chain step (docs/design/batching.md, "The chained
drafter at B rows" and "The scheduler").

The step graph of ``B`` rows (``chain_graph.step_component(rows=True)``) binds the batched
target's last-layer buffers ``[B, KV, capacity, d]`` themselves as its borrowed caches, its
length port to the rows' committed lengths ``C'_b`` and its positions to ``C'_b − 1``; row
``b``'s token and carry are its own chain context (the last kept token and its row of the
batched pass's seed output), exactly what its batch-1 proposal feeds. Invariant: row ``b``'s
step reads the slots ``[0, C'_b)`` of row ``b`` and writes no buffer, so a row's drafts are
those it draws alone; a row that does not speculate in the step gets length 0 and is ignored.
Rows of different ``k`` run to the widest and each is cut at its own ``k``.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace

import numpy as np

from speculant.errors import ChainError, SpeculantError
from speculant.package.package import Package
from speculant.session.session import ComponentSession
from speculant.speculative.chain_graph import CARRY, NEXT, TABLE, TOKEN
from speculant.speculative.chained import ChainedProposer, proposer_length_port
from speculant.speculative.proposal import Proposal
from speculant.tensors import NUMPY_DTYPES, Value
from speculant.workflow.batched_pass import BatchedTargetPass, row_bucket
from speculant.workflow.sampler import choose
from speculant.workflow.state import DecodeState

UNSUPPORTED_REMEDY = ("decode chained requests alone (engine.generate), or use "
                      "proposer='prompt_lookup' or 'draft' with the scheduler")


class ChainRows:
    """Drafts for the chained rows of a step, one run per chain step (see the module);
    ``propose`` is one row's alone, through the same runs."""

    def __init__(self, package: Package, proposer: ChainedProposer, target: BatchedTargetPass,
                 session: ComponentSession, bootstrap: ComponentSession) -> None:
        """``session`` runs the step graph of ``B`` rows, ``bootstrap`` its step 0 (the carry
        alone); a proposer input the batched pass does not keep is a ChainError."""
        plan, chain = package.plan, proposer.chain
        self.proposer, self.chain, self.target = proposer, chain, target
        self.session, self.bootstrap, self.seam = session, bootstrap, session.seam
        self.residency = session.output_residency
        positions = plan.target_inputs.get(plan.port_by_role.get("position_ids", ""))
        length_port = proposer_length_port(package)
        self.borrowed: dict[str, str] = {}  # port -> the batched target's cell (its buffer)
        self.filled: dict[str, tuple[str, list[int]]] = {}  # port -> ("length" | "position", shape)
        for port, value_name in plan.proposer_inputs.items():
            if port == chain.fused_port:
                continue
            if port in chain.borrowed:
                self.borrowed[port] = chain.borrowed[port]
                continue
            contract = session.ports.inputs[port]
            shape = [target.rows if axis == contract.batch_layout.axis else 1
                     for axis in range(contract.rank)]
            is_row_wise = contract.batch_layout.axis == 0 and all(
                dim == 1 or dim == chain.position_symbol for dim in contract.dims[1:])
            if port == length_port and contract.rank == 1 and is_row_wise:
                self.filled[port] = ("length", shape)
            elif value_name == positions and positions is not None and is_row_wise:
                self.filled[port] = ("position", shape)
            else:
                raise ChainError(
                    f"the chained drafter's input '{port}' (bound to '{value_name}', "
                    f"{list(contract.dims)}) is none the batched pass keeps per row (its "
                    "lengths, positions and caches)", path=port, value=value_name,
                    file=str(package.artifacts[plan.proposer or ""]),
                    remedy=UNSUPPORTED_REMEDY)

    def propose(self, state: DecodeState, k: int) -> Proposal:
        """``k`` drafts for one row (the Proposer protocol), by the rows' runs."""
        result = self.propose_rows([(state, k)])[0]
        if isinstance(result, SpeculantError):
            raise result
        return result

    def propose_rows(self, requests: Sequence[tuple[DecodeState, int]]
                     ) -> list[Proposal | SpeculantError]:
        """Each request's drafts (``k >= 1``, its row taken), or what ended its proposal (its
        chain context); a failed run raises for every row. Steps ``0 … max k``: step 0 gives
        each row's carry (its prediction is the pending token, known), step ``j`` row ``b``'s
        draft ``j`` where ``j <= k_b`` — its argmax, or under sampling its draw at position
        ``C + j`` (``q_j`` kept for rejection sampling), as alone; under a grammar the tokens
        it forces first, then the row masked by it, cut where it refuses a draft or ends."""
        seam, chain, target = self.seam, self.chain, self.target
        num_rows = row_bucket(max(state.cells.row for state, _ in requests), target.rows)
        results: list[Proposal | SpeculantError] = []
        rows: list[tuple[int, DecodeState, int, int]] = []  # (request, state, k, row)
        tokens = np.zeros(num_rows, np.int32)  # [B] int32: each row's token this step
        lengths = np.zeros(num_rows, np.int64)  # [B] C'_b (0: a row that does not speculate)
        carries = seam.zeros((num_rows, 1, chain.carry_width or 0), chain.currency,
                             self.residency)  # [B, 1, W_C] carry_0 of each row
        for i, (state, k) in enumerate(requests):
            try:
                last, carry_0 = self.proposer.chain_context(state)
            except SpeculantError as error:
                results.append(error)
                continue
            row = state.cells.row
            assert row is not None and k >= 1, "a row speculates with k >= 1 drafts"
            results.append(Proposal())
            rows.append((i, state, k, row))
            tokens[row], lengths[row] = last, state.consumed
            seam.scatter_into_last_axis(seam.owned_rows(carries, row, 1), carry_0, 0)
        if not rows:
            return results
        borrowed = {port: seam.owned_rows(target.buffers[cell], 0, num_rows)
                    for port, cell in self.borrowed.items()}  # the rows' first num_rows
        fixed = {TABLE: self.proposer.table, **borrowed, **self._filled(lengths)}
        carry = self._run(self.bootstrap, fixed, tokens, carries, [chain.carry_output]
                          )[chain.carry_output]
        drafts: dict[int, list[int]] = {i: [] for i, *_ in rows}
        probs: dict[int, list[Value]] = {i: [] for i, *_ in rows}
        steps = dict.fromkeys(drafts, 0)  # each row's steps run past step 0
        scored = dict.fromkeys(drafts, 0)
        ended: set[int] = set()  # rows whose grammar refused a draft or finished
        with ExitStack() as drafting:
            forced = {i: self._forced(state, k, drafting) for i, state, k, _ in rows}
            for _, state, _, row in rows:
                tokens[row] = state.pending
            for j in range(1, max(k for _, _, k, _ in rows) + 1):
                out = self._run(self.session, fixed, tokens, carry,
                                [chain.logits_output, chain.carry_output, NEXT])
                carry, logits = out[chain.carry_output], out[chain.logits_output]  # [B,1,V]
                argmax = seam.read_token_ids(replace(out[NEXT], kind="token_ids"))  # [B]
                for i, state, k, row in rows:
                    constraint = state.constraint
                    if j > k or i in ended:
                        continue
                    steps[i] = j
                    if j <= len(forced[i]):
                        draft, q = forced[i][j - 1], None
                    elif state.sampler is None and constraint is None:
                        draft, q = argmax[row], None
                        scored[i] += 1
                    else:  # a draw, or the row masked by the grammar
                        scores = seam.slice_axis(logits, 0, row, 1)  # [1, 1, V] row b's
                        draft, q = choose(seam, state.sampler, seam.last_along_axis(
                            scores, scores.rank - 2), state.consumed + j, constraint)
                        scored[i] += 1
                    if constraint is not None and not constraint.advance(draft):
                        ended.add(i)  # refused: the row drafts no further
                        continue
                    tokens[row] = draft
                    drafts[i].append(draft)
                    if q is not None:
                        probs[i].append(q)
                    if constraint is not None and constraint.is_finished:
                        ended.add(i)
        for i, *_ in rows:
            results[i] = Proposal(drafts[i], probs[i] or None,
                                  num_invocations=1 + steps[i],
                                  num_scored_rows=scored[i])
        return results

    @staticmethod
    def _forced(state: DecodeState, k: int, drafting: ExitStack) -> list[int]:
        """Under a grammar, the tokens it forces (a row's first drafts, as alone) — none
        under a draw that returns its q — its drafting entered in ``drafting``."""
        constraint = state.constraint
        if constraint is None:
            return []
        drafting.enter_context(constraint.drafting())
        return constraint.forced_tokens(k) if state.sampler is None or \
            state.sampler.is_keyed else []

    def _filled(self, lengths: np.ndarray) -> dict[str, Value]:
        """The length and position ports: ``C'_b`` and ``C'_b − 1`` per row (0 for a row
        that does not speculate)."""
        filled = {}
        for port, (what, shape) in self.filled.items():
            values = lengths if what == "length" else np.maximum(lengths - 1, 0)
            dtype = self.session.ports.inputs[port].dtype
            host = Value.host(values.astype(NUMPY_DTYPES[dtype]).reshape(
                [len(values), *shape[1:]]), dtype)  # the run's rows on axis 0
            filled[port] = self.seam.adopt(host, self.residency)
        return filled

    def _run(self, session: ComponentSession, fixed: dict[str, Value], tokens: np.ndarray,
             carry: Value, outputs: list[str]) -> dict[str, Value]:
        """One run of ``B`` rows fed ``tokens`` and ``carry`` (a ChainError naming the
        step graph where ONNX Runtime fails it)."""
        token_ids = self.seam.adopt(Value.host(tokens.copy(), "int32"), self.residency)
        try:
            return session.invoke({**fixed, TOKEN: token_ids, CARRY: carry}, outputs,
                                  check=False)
        except Exception as exc:  # ORT raises its own exception types; wrap them (A9)
            raise ChainError(f"ONNX Runtime failed the chained drafter's step of "
                             f"{self.target.rows} rows: {exc}", path=session.name,
                             remedy=UNSUPPORTED_REMEDY) from exc
