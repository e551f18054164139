"""The chained proposal (runtime.md §8-§9): an MTP/EAGLE-style drafter, step by step.

Each step feeds the drafter ``concat(scaled_table[last], carry)`` in one owned buffer of the
chain's currency, built where the chain executes; the borrowed caches are the owner's cells
as they stand after rollback; only the drafted token ids cross to the host.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from speculant.errors import ChainError, ContractError
from speculant.package.package import Package
from speculant.package.plan import ChainPlan
from speculant.session.plan import PassPlan
from speculant.session.session import ComponentSession
from speculant.speculative.proposal import Proposal
from speculant.tensors import NUMPY_DTYPES, TensorSeam, Value
from speculant.workflow.sampler import choose
from speculant.workflow.state import DecodeState
from speculant.workflow.static_cells import StaticCells
from speculant.workflow.target_pass import PassResult

SCALE_ROWS_PER_CHUNK = 4096


def read_scaled_table(package: Package, chain: ChainPlan) -> np.ndarray:
    """The declared embedding table ``[V_E, W_E]``, read from the target artifact and scaled
    once: each element becomes ``round_currency(f32(element) · f32(round_currency(scale)))``,
    walking bounded row chunks so the whole table is never widened. Load
    admitted the table (an initializer of the target, in the chain's currency: A6)."""
    graph = package.graphs[package.plan.target].graph
    initializer = next(i for i in graph.initializer if i.name == chain.table)
    base_dir = str(package.artifacts[package.plan.target].parent)
    if initializer.data_location == onnx.TensorProto.EXTERNAL:
        table = numpy_helper.to_array(initializer, base_dir=base_dir)
    else:
        table = numpy_helper.to_array(initializer)
    table = np.array(table, copy=True, order="C")  # writable: scaled in place below
    if chain.scale is not None:
        scale = np.float32(NUMPY_DTYPES[chain.currency].type(chain.scale))
        for start in range(0, table.shape[0], SCALE_ROWS_PER_CHUNK):
            rows = table[start:start + SCALE_ROWS_PER_CHUNK]
            rows[...] = (rows.astype(np.float32) * scale).astype(table.dtype)
    return table


class ChainedProposer:
    """Drafts ``k_r`` tokens per round from the chain context of the decode state."""

    def __init__(self, package: Package, session: ComponentSession, seam: TensorSeam) -> None:
        assert package.plan.chain is not None
        self.package = package
        self.chain = package.plan.chain
        self.session = session
        self.seam = seam
        # The chain residency: where the proposer's outputs are produced (its execution device,
        # or the host in the host-staged parity configuration).
        self.residency = session.output_residency
        self._table: Value | None = None  # [V_E, W_E] currency, scaled, in the chain residency
        fused = session.ports.inputs[self.chain.fused_port]
        self.fused_dims = fused.dims
        self.fused_request_axis = fused.batch_layout.axis

    @property
    def table(self) -> Value:
        """The scaled table, read once per runtime and adopted once into the chain residency."""
        if self._table is None:
            host_table = Value.host(read_scaled_table(self.package, self.chain),
                                    self.chain.currency)
            self.seam.counters.embedding_table_reads += 1
            self._table = self.seam.adopt(host_table, self.residency)
            if self._table is not host_table:
                self.seam.counters.embedding_table_mirrors += 1
        return self._table

    def propose(self, state: DecodeState, k: int) -> Proposal:
        """Run ``k + 1`` drafter steps (bootstrap included) and return ``k`` drafts: each
        the argmax of its step's row, or under sampling a draw from ``q_j = T(row)``,
        returned with the ``q_j`` (the bootstrap step draws nothing). A subset vocabulary
        (``speculative.vocabulary: subset``) gives ``q_j`` over its ``V_q`` ids, each id
        used unchanged as the target's; the verifier reads ``q_j = 0`` beyond them. Greedy on
        static caches the drafts stay where the chain runs (``Proposal.drafts`` [k] int32:
        each step's argmax feeds the next step's gather there, and the round verifies them
        in place); otherwise each draft is read back (4 bytes) as it is made."""
        pass_result, num_kept = state.latest, state.num_kept
        assert pass_result is not None
        seam, chain = self.seam, self.chain
        cells = state.cells
        plan = cells.proposer_plan if isinstance(cells, StaticCells) else None
        with seam.write_batch():  # the fixed bindings, once per proposal
            fixed = self._fixed_bindings(state, plan)
        carry = self._carry_0(pass_result, num_kept)  # [1, 1, W_C] currency
        table = self.table  # [V_E, W_E]
        if plan is not None:  # static caches: the request's plan, its small inputs rewritten
            fused = plan.inputs[chain.fused_port]
        else:
            fused = seam.zeros(self._step_shape(table.shape[1], carry.shape[-1]),
                               chain.currency, self.residency)  # [1, 1, W_F], per proposal
        last = pass_result.tokens[num_kept - 1]  # s: the last consumed token
        if not 0 <= last < table.shape[0]:
            raise ChainError(f"token {last} is outside the embedding table's {table.shape[0]} "
                             "rows", value=last, expected=f"0 <= id < {table.shape[0]}")
        kept = state.sampler is None and isinstance(cells, StaticCells)
        kept_drafts = seam.zeros((k,), "int32", self.residency) if kept else None  # [k] int32
        last_ids: Value | None = None  # [1] int32: the previous step's argmax, where it is
        drafts: list[int] = []
        probs: list[Value] = []  # q_j = T(step j's row) when sampling
        for j in range(k + 1):
            with seam.write_batch():  # one step's fused input: concat(table[last], carry)
                row = seam.gather_rows(table, [last]) if last_ids is None else \
                    seam.gather_rows_at(table, last_ids)
                seam.scatter_into_last_axis(fused, row, 0)
                seam.scatter_into_last_axis(fused, carry, table.shape[1])
            if plan is not None:
                out = plan.run()
            else:
                out = self.session.invoke({**fixed, chain.fused_port: fused},
                                          [chain.logits_output, chain.carry_output])
                if isinstance(cells, StaticCells):  # checked once; then planned
                    plan = cells.proposer_plan = self._plan({**fixed, chain.fused_port: fused},
                                                            out)
                    fused = plan.inputs[chain.fused_port] if plan is not None else fused
            if j < k:
                carry = self._step_carry(out[chain.carry_output])
            if j == 0:
                last = state.pending  # bootstrap: its prediction is p, already known
                continue
            logits = out[chain.logits_output]  # [1, 1, V] draft scores
            scores = seam.last_along_axis(logits, logits.rank - 2)
            if kept_drafts is not None:  # the argmax stays: it feeds the next step's gather
                last_ids = seam.argmax_rows(scores)  # [1] int32
                seam.scatter_into_last_axis(kept_drafts, last_ids, j - 1)
                continue
            last, q = choose(seam, state.sampler, scores)
            drafts.append(last)  # 4 bytes read back
            if q is not None:
                probs.append(q)
        return Proposal(drafts, probs if state.sampler is not None else None,
                        num_invocations=k + 1, num_scored_rows=k, drafts=kept_drafts)

    def _plan(self, inputs: dict[str, Value], produced: dict[str, Value]) -> PassPlan:
        """The drafter step's plan on static caches, made after its first (checked) step:
        the borrowed ports bound to the target's buffers themselves (read in place, never
        copied), a buffer of its own for every other input and output. Per proposal it then
        writes ``position_ids`` and ``cache_lengths``; per step the fused input."""
        seam, session = self.seam, self.session
        buffers: dict[str, Value] = {}
        with seam.write_batch():
            for port, value in inputs.items():
                if port in self.chain.borrowed:
                    buffers[port] = value  # the target's buffer of the last layer
                    continue
                buffer = seam.zeros(value.shape, value.dtype, session.device)
                buffers[port] = PassPlan._fill(session, port, buffer, value)
            outputs = {port: seam.zeros(value.shape, value.dtype, session.output_residency)
                       for port, value in produced.items()}
        return PassPlan(session, buffers, outputs)

    def _carry_0(self, pass_result: PassResult, num_kept: int) -> Value:
        """Row ``num_kept − 1`` of the latest pass's seed output, in the chain residency."""
        seed = pass_result.seed
        assert seed is not None  # load checked the target invoke binds the seed output
        try:
            carry_0 = self.seam.slice_axis(seed, seed.rank - 2, num_kept - 1, 1)  # [1, 1, W_C]
        except ContractError as exc:
            raise ChainError(f"cannot take carry_0 at row {num_kept - 1} of "
                             f"'{self.chain.seed_output}' {seed.describe()}: {exc}",
                             path="speculative.proposal_execution.folded_carry_seed") from exc
        return self.seam.adopt(carry_0, self.residency)

    def _step_carry(self, step_carry: Value) -> Value:
        """The carry a step hands to the next: its last row [1, 1, W_C]."""
        return self.seam.adopt(self.seam.last_along_axis(step_carry, step_carry.rank - 2),
                               self.residency)

    # -- bindings fixed for one proposal ---------------------------------------------------
    def _fixed_bindings(self, state: DecodeState, step_plan: PassPlan | None) -> dict[str, Value]:
        """The proposer's inputs other than the fused one, for this proposal; with a
        ``step_plan`` (static caches) written into its buffers instead (the borrowed caches are
        bound to the target's buffers themselves, the length is written in place)."""
        pass_result, num_kept = state.latest, state.num_kept
        assert pass_result is not None
        consumed = pass_result.start + num_kept  # C'
        fixed: dict[str, Value] = {}
        plan = self.package.plan
        length_port = plan.static.kv_length_ports.get(plan.proposer or "") \
            if plan.static is not None else None
        for port, value_name in plan.proposer_inputs.items():
            if port == self.chain.fused_port:
                continue
            cell = self.chain.borrowed.get(port)
            if cell is not None:  # a borrowed cache: the owner's output, rolled back to C'
                # (static caches: the target's buffer itself, no copy; C' is its length)
                fixed[port] = self.seam.adopt(state.cells[cell], self.residency)
                continue
            if port == length_port and step_plan is not None:  # the drafter sees slots [0, C')
                length = step_plan.inputs[port]
                self.seam.write_ints(length, [consumed] * length.size)
                continue
            if port == length_port:
                dtype = self.session.ports.inputs[port].dtype
                fixed[port] = self.seam.adopt(Value.host(
                    np.full((1,), consumed, NUMPY_DTYPES[dtype]), dtype), self.residency)
                continue
            value = pass_result.values.get(value_name)
            if value is None:
                raise ChainError(f"proposer port '{port}' is bound to '{value_name}', which the "
                                 "latest pass did not bind or produce", path=port)
            dims = self.session.ports.inputs[port].dims
            for axis, dim in enumerate(dims):
                try:
                    if dim is not None and dim == self.chain.position_symbol:
                        value = self.seam.slice_axis(value, axis, num_kept - 1, 1)
                    elif dim is not None and dim == self.chain.kv_symbol:
                        value = self.seam.truncate_axis(value, axis, consumed)
                except ContractError as exc:
                    raise ChainError(f"cannot narrow '{value_name}' for proposer port '{port}' "
                                     f"on axis {axis} ({dim}): {exc}", path=port) from exc
            fixed[port] = self.seam.adopt(value, self.residency)
            if step_plan is not None:
                step_plan.write(port, fixed[port])
        return fixed

    def _step_shape(self, embed_width: int, carry_width: int) -> tuple[int, ...]:
        """The fused input's shape; load checked W_E + W_C = W_F where W_F is static."""
        fused_width = embed_width + carry_width
        shape = []
        for axis, dim in enumerate(self.fused_dims):
            if axis == len(self.fused_dims) - 1:
                shape.append(fused_width)
            elif axis == self.fused_request_axis or dim == self.chain.position_symbol:
                shape.append(1)
            elif isinstance(dim, int):
                shape.append(dim)
            else:
                raise ChainError(f"axis {axis} ({dim!r}) of the fused port "
                                 f"'{self.chain.fused_port}' has no extent speculant can derive",
                                 value=dim)
        return tuple(shape)
