"""The chained proposal (runtime.md §8-§9): an MTP/EAGLE-style drafter, step by step.

Each step feeds the drafter ``concat(scaled_table[last], carry)`` in one owned buffer of the
chain's currency, built where the chain executes; the borrowed caches are the owner's cells
as they stand after rollback; only the drafted token ids cross to the host.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from speculant.errors import ChainError, ContractError, UnsupportedError
from speculant.package.package import Package
from speculant.package.plan import ChainPlan
from speculant.session.session import ComponentSession
from speculant.speculative.proposal import Proposal
from speculant.tensors import NUMPY_DTYPES, TensorSeam, Value
from speculant.workflow.sampler import choose
from speculant.workflow.state import DecodeState

SCALE_ROWS_PER_CHUNK = 4096


def read_scaled_table(package: Package, chain: ChainPlan) -> np.ndarray:
    """The declared embedding table ``[V_E, W_E]``, read from the target artifact and scaled
    once: each element becomes ``round_currency(f32(element) · f32(round_currency(scale)))``,
    walking bounded row chunks so the whole table is never widened (runtime.md §9.3)."""
    graph = package.graphs[package.plan.target].graph
    initializer = next((i for i in graph.initializer if i.name == chain.table), None)
    if initializer is None:
        raise ChainError(f"embedding table '{chain.table}' is not an initializer of "
                         f"'{package.plan.target}'",
                         path="speculative.proposal_execution.token_embedding.table")
    base_dir = str(package.artifacts[package.plan.target].parent)
    if initializer.data_location == onnx.TensorProto.EXTERNAL:
        table = numpy_helper.to_array(initializer, base_dir=base_dir)
    else:
        table = numpy_helper.to_array(initializer)
    if table.dtype != NUMPY_DTYPES[chain.currency]:
        raise ChainError(
            f"embedding table '{chain.table}' is {table.dtype}, the chain's currency (dtype of "
            f"the fused port '{chain.fused_port}') is {chain.currency}",
            path="speculative.proposal_execution.token_embedding.table",
            value=str(table.dtype), expected=chain.currency)
    table = np.array(table, copy=True, order="C")  # writable: scaled in place below
    if chain.scale is not None:
        scale = np.float32(NUMPY_DTYPES[chain.currency].type(chain.scale))
        for start in range(0, table.shape[0], SCALE_ROWS_PER_CHUNK):
            rows = table[start:start + SCALE_ROWS_PER_CHUNK]
            rows[...] = (rows.astype(np.float32) * scale).astype(table.dtype)
    return table


class ChainedProposer:
    """Drafts ``k_r`` tokens per round from the chain context of the decode state."""

    def __init__(self, package: Package, session: ComponentSession, seam: TensorSeam,
                 target_vocab: int | None) -> None:
        assert package.plan.chain is not None
        self.package = package
        self.chain = package.plan.chain
        self.session = session
        self.seam = seam
        # The chain residency: where the proposer's outputs are produced (its execution device,
        # or the host in the host-staged parity configuration).
        self.residency = session.output_residency
        self.target_vocab = target_vocab
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
        returned with the ``q_j`` (the bootstrap step draws nothing)."""
        vp, keep = state.latest, state.keep
        assert vp is not None
        seam, chain = self.seam, self.chain
        with seam.write_batch():  # adoptions of the fixed bindings, once per proposal
            fixed = self._fixed_bindings(state)
        if vp.seed is None:
            raise ChainError(f"the latest pass produced no '{chain.seed_output}' (the "
                             "folded_carry_seed); the chain cannot start",
                             path="speculative.proposal_execution.folded_carry_seed")
        missing = [port for port in (chain.logits_output, chain.carry_output)
                   if port not in self.session.output_names]
        if missing:
            raise ChainError(f"the proposer '{self.session.name}' produces no {missing} (its "
                             f"graph outputs are {self.session.output_names})",
                             path="speculative.proposal_execution", value=missing)
        try:
            carry_0 = seam.slice_axis(vp.seed, vp.seed.rank - 2, keep - 1, 1)  # [1, 1, W_C]
        except ContractError as exc:
            raise ChainError(f"cannot take carry_0 at row {keep - 1} of '{chain.seed_output}' "
                             f"{vp.seed.describe()}: {exc}",
                             path="speculative.proposal_execution.folded_carry_seed") from exc
        carry = self._in_currency(seam.adopt(carry_0, self.residency), "carry_0")
        table = self.table  # [V_E, W_E]
        fused = seam.zeros(self._step_shape(table.shape[1], carry.shape[-1]), chain.currency,
                           self.residency)  # [1, 1, W_F] currency, one buffer per proposal
        last, drafts = vp.tokens[keep - 1], []  # s: the last consumed token
        probs: list[Value] = []  # q_j = T(step j's row) when sampling (runtime.md §17.3)
        for j in range(k + 1):
            if not 0 <= last < table.shape[0]:
                raise ChainError(f"token {last} is outside the embedding table's {table.shape[0]}"
                                 " rows", value=last, expected=f"0 <= id < {table.shape[0]}")
            with seam.write_batch():  # one step's fused input: concat(table[last], carry)
                seam.scatter_into_last_axis(fused, seam.gather_rows(table, [last]), 0)
                seam.scatter_into_last_axis(fused, carry, table.shape[1])
            out = self.session.invoke({**fixed, chain.fused_port: fused},
                                      [chain.logits_output, chain.carry_output])
            if j < k:
                step_carry = out[chain.carry_output]  # [1, 1, W_C]
                carry = self._in_currency(seam.adopt(
                    seam.last_along_axis(step_carry, step_carry.rank - 2), self.residency),
                    f"step {j} carry")
            if j == 0:
                last = state.pending  # bootstrap: its prediction is p, already known
                continue
            logits = out[chain.logits_output]  # [1, 1, V] draft scores
            row = seam.last_along_axis(logits, logits.rank - 2)
            last, q = choose(seam, state.sampler, row, state.stats)  # 4 bytes read back
            if q is not None and self.target_vocab is not None and \
                    q.shape[-1] != self.target_vocab:
                raise UnsupportedError(
                    f"sampling with a proposer of {q.shape[-1]} logits and a target of "
                    f"{self.target_vocab} (speculative.vocabulary: subset) is not supported: "
                    "rejection sampling needs q over the target's vocabulary",
                    path="speculative.vocabulary", value=q.shape[-1],
                    remedy="decode greedily (temperature 0), or without the proposer")
            if self.target_vocab is not None and not 0 <= last < self.target_vocab:
                raise ChainError(f"drafted token {last} is outside the target vocabulary "
                                 f"[0, {self.target_vocab})", value=last)
            drafts.append(last)
            if q is not None:
                probs.append(q)
        state.stats.proposer_invocations += k + 1
        return Proposal(drafts, probs if state.sampler is not None else None)

    # -- bindings fixed for one proposal (runtime.md §9.2) ---------------------------------
    def _fixed_bindings(self, state: DecodeState) -> dict[str, Value]:
        vp, keep = state.latest, state.keep
        assert vp is not None
        consumed = vp.start + keep  # C'
        fixed: dict[str, Value] = {}
        for port, value_name in self.package.plan.proposer_inputs.items():
            if port == self.chain.fused_port:
                continue
            cell = self.chain.borrowed.get(port)
            if cell is not None:  # a borrowed cache: the owner's output, rolled back to C'
                fixed[port] = self.seam.adopt(state.cells[cell], self.residency)
                continue
            value = vp.values.get(value_name)
            if value is None:
                raise ChainError(f"proposer port '{port}' is bound to '{value_name}', which the "
                                 "latest pass did not bind or produce", path=port)
            dims = self.session.ports.inputs[port].dims
            for axis, dim in enumerate(dims):
                try:
                    if dim is not None and dim == self.chain.position_symbol:
                        value = self.seam.slice_axis(value, axis, keep - 1, 1)
                    elif dim is not None and dim == self.chain.kv_symbol:
                        value = self.seam.truncate_axis(value, axis, consumed)
                except ContractError as exc:
                    raise ChainError(f"cannot narrow '{value_name}' for proposer port '{port}' "
                                     f"on axis {axis} ({dim}): {exc}", path=port) from exc
            fixed[port] = self.seam.adopt(value, self.residency)
        return fixed

    def _in_currency(self, carry: Value, what: str) -> Value:
        if carry.dtype != self.chain.currency:
            raise ChainError(
                f"{what} is {carry.dtype}, the chain's currency (the fused port "
                f"'{self.chain.fused_port}') is {self.chain.currency}; speculant never converts",
                value=carry.dtype, expected=self.chain.currency)
        return carry

    def _step_shape(self, embed_width: int, carry_width: int) -> tuple[int, ...]:
        fused_width = embed_width + carry_width
        declared = self.fused_dims[-1]
        if isinstance(declared, int) and declared != fused_width:
            raise ChainError(
                f"embedding width {embed_width} + carry width {carry_width} != fused width "
                f"{declared} of port '{self.chain.fused_port}'", value=fused_width,
                expected=str(declared))
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
