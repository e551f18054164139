"""`BatchedTargetPass`: one run of the target's batched graph over every row of the engine's
caches (docs/design/batching.md), the pass the scheduler (speculative/scheduler.py) runs once
per step.

The engine owns one buffer ``[B, KV, capacity, d]`` per cell, bound as both the past and the
present of every pass (one buffer: the graph writes it in place). Row ``b`` is one request's
(:class:`~speculant.workflow.cells.RowCells`) or free. A pass takes each busy row's block and
its start ``L_b`` — the row's decode state's consumed count, the one home of its length — and
writes ``input_ids [B, W]`` right-padded, ``position_ids = L_b + [0, W)``, ``cache_lengths =
L_b`` and ``block_lengths = W_b`` (0, at cursor 0, for a free row: never written, never read).
Invariant: ``L_b + W <= capacity`` for every row (the graph gathers and scatters the whole
window), checked before each run; the scheduler keeps ``W`` within it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from speculant.errors import AdmissionError, ContractError, RequestError
from speculant.package.model import Ports
from speculant.package.package import Package
from speculant.package.plan import BatchPlan
from speculant.session.plan import PassPlan
from speculant.session.session import ComponentSession
from speculant.tensors import NUMPY_DTYPES, TensorSeam, Value
from speculant.workflow.cells import CAPACITY_STEP, RowCells
from speculant.workflow.state import cell_shape
from speculant.workflow.target_pass import PassResult

KEPT_WIDTHS = 16  # plans of wider blocks (prompt chunks) are made for their pass alone


def copy_prefix(seam: TensorSeam, old: Value, new: Value, axis: int) -> None:
    """``old`` into the first slots of ``new`` along ``axis`` (the axes before it equal): one
    contiguous block copy per index of the axes before ``axis``."""
    if axis == 0:
        seam.scatter_into_last_axis(seam.owned_rows(new, 0, old.shape[0]), old, 0)
        return
    for i in range(old.shape[0]):
        copy_prefix(seam, seam.owned_rows(old, i, 1, squeeze=True),
                    seam.owned_rows(new, i, 1, squeeze=True), axis - 1)


def row_bucket(highest_row: int, num_rows: int) -> int:
    """The rows a run covers: the first ``n`` of the buffers, ``n`` the power of two (at most
    ``num_rows``) past the highest busy row; the rows after it are not computed."""
    return min(num_rows, 1 << highest_row.bit_length())


class PassArgmax:
    """The argmax of every row of one batched pass's logits ``[rows, W, V]``: one reduction
    and one read-back for all its rows (not one a row), made when a row first asks. Its rows
    are read in the step that ran the pass, before the plan's next run rewrites the logits."""

    def __init__(self, seam: TensorSeam, logits: Value) -> None:
        self.seam, self.logits = seam, logits
        self._ids: np.ndarray | None = None  # [rows, W] int64, once asked

    def of(self, row: int, width: int) -> Callable[[], list[int]]:  # its block's ids
        return lambda: self._every_row()[row, :width].tolist()

    def _every_row(self) -> np.ndarray:
        if self._ids is None:
            ids = self.seam.read_token_ids(self.seam.argmax_rows(self.logits))
            self._ids = np.asarray(ids, np.int64).reshape(self.logits.shape[:2])
        return self._ids


@dataclass(frozen=True)
class RowBlock:
    """One row's part of a batched pass."""

    tokens: tuple[int, ...]  # the row's block, W_b tokens (at least one)
    start: int  # L_b: the row's consumed count, where the block is written
    cells: RowCells  # the row it runs in


def row_cursors(blocks: Sequence[RowBlock], num_rows: int, first: int = 0) -> np.ndarray:
    """``cache_lengths`` [B] int64 of rows ``[first, first + B)``: each busy row's start, 0
    for a free row."""
    cursors = np.zeros(num_rows, np.int64)
    for block in blocks:
        cursors[block.cells.row - first] = block.start
    return cursors


def row_widths(blocks: Sequence[RowBlock], num_rows: int, width: int,
               first: int = 0) -> np.ndarray:
    """``block_lengths`` [B] int64 of rows ``[first, first + B)``: each busy row's ``W_b``,
    0 for a free row (``width``, the block's ``W``, is what a row may not exceed)."""
    widths = np.zeros(num_rows, np.int64)
    for block in blocks:
        widths[block.cells.row - first] = len(block.tokens)
    return widths


def batch_of(package: Package) -> BatchPlan:
    """The package's batched graph, or a RequestError saying it has none."""
    static = package.plan.static
    if static is None or static.batch is None or package.batched_artifact is None:
        raise RequestError(
            "this package has no batched target graph, so its requests cannot be decoded "
            "together (it decodes one request at a time)", path="batch",
            file=str(package.root), value="1 only",
            remedy="decode with engine.generate(...), or write the package with static "
                   "caches and batch=N (write_pair_package / write_decoder_package)")
    return static.batch


def batched_ports(package: Package) -> Ports:
    """The batched graph's ports: the target's, and ``block_lengths`` [batch] int64 (the
    cursor port's contract)."""
    plan, batch = package.plan, batch_of(package)
    assert plan.static is not None
    ports = package.document.workflow.components[plan.target].ports
    assert ports is not None
    cursor = ports.inputs[plan.static.write_indices_ports[plan.target]]
    return ports.model_copy(update={"inputs": {**ports.inputs,
                                               batch.block_lengths_port: cursor}})


def open_batched_pass(package: Package, make_session: Callable[..., ComponentSession],
                      rows: int | None, single: ComponentSession) -> BatchedTargetPass:
    """The package's batched graph as a pass of ``rows`` rows (None: its ``max_rows``) over
    rows of its caches' capacity, in a session of its own: ``make_session(name, source,
    ports, artifact)``; ``single``: its batch-1 session (:class:`BatchedTargetPass`)."""
    batch, static = batch_of(package), package.plan.static
    assert static is not None and static.capacity is not None
    artifact = str(package.batched_artifact)
    session = make_session(f"{package.plan.target}.batched", artifact, batched_ports(package),
                           artifact)
    return BatchedTargetPass(package, session, capacity=static.capacity, single=single,
                             rows=batch.max_rows if rows is None else rows)


class BatchedTargetPass:
    """The target's batched graph on the engine's device, its buffers, and its pass plans
    (one per block width ``W``, at ``B = rows``)."""

    def __init__(self, package: Package, session: ComponentSession, *, rows: int,
                 capacity: int, single: ComponentSession | None = None) -> None:
        """``single``: the target's own (batch-1) session, which runs a pass of the first
        row alone: the same ports less ``block_lengths``, the same static-cache contract, and
        the graph a request decoded alone runs (on the CPU the fused kernels)."""
        plan, batch = package.plan, batch_of(package)
        static = plan.static
        assert static is not None
        field = batch.field
        if not 1 <= rows <= batch.max_rows:
            raise AdmissionError(f"{rows} rows asked of a batched graph of at most "
                                 f"{batch.max_rows}", path=field.rsplit(".artifacts", 1)[0] +
                                 ".max_rows", value=rows, expected=f"1 <= rows <= "
                                 f"{batch.max_rows}")
        if static.capacity is not None and not 1 <= capacity <= static.capacity:
            raise AdmissionError(f"a capacity of {capacity} slots per row asked of caches of "
                                 f"at most {static.capacity}", path=static.capacity_input,
                                 value=capacity, expected=f"1 <= capacity <= "
                                                          f"{static.capacity}")
        self.session, self.seam, self.single = session, session.seam, single
        self.artifact, self.field = str(package.batched_artifact), field
        self.rows, self.max_capacity = rows, capacity
        target = plan.target
        self.roles = {plan.port_by_role.get("token_ids"): "tokens",
                      plan.port_by_role.get("position_ids"): "positions",
                      static.write_indices_ports.get(target): "cursors",
                      static.kv_length_ports.get(target): "cursors",
                      batch.block_lengths_port: "widths"}
        self.cell_of = {cell.owner_input: name for name, cell in plan.cells.items()}
        self.present_of = {cell.owner_output: name for name, cell in plan.cells.items()}
        self.cell_port = {name: cell.owner_input for name, cell in plan.cells.items()}
        ports = [*plan.target_inputs, batch.block_lengths_port]
        unknown = [p for p in ports if p not in self.roles and p not in self.cell_of]
        if unknown or "tokens" not in self.roles.values():
            raise AdmissionError(
                f"the batched target binds only token ids, positions, cursors, block lengths "
                f"and its caches; input(s) {unknown or ['(no token ids port)']} are beyond "
                "what the scheduler writes", file=str(package.batched_artifact), path=field,
                remedy="decode with engine.generate(...) (batch 1)")
        self.inputs = {port: session.ports.inputs[port] for port in ports}
        self.logits_port = plan.port_by_role.get("logits", "logits")
        self.vocab = package.logits_width
        seed = session.ports.outputs.get(plan.chain.seed_output) if plan.chain else None
        # the chained drafter's seed [B, W, H] (chain_rows.py reads each row's kept row)
        self.seed_port = plan.chain.seed_output if seed is not None and isinstance(
            seed.dims[-1], int) else None
        self.shapes = {}  # cell -> (its shape at capacity 0, its sequence axis, its dtype)
        for name, cell in plan.cells.items():
            shape = cell_shape(package, cell, 0)
            shape[cell.contract.batch_layout.axis if cell.contract.batch_layout else 0] = rows
            self.shapes[name] = (shape, cell.sequence_axis, cell.contract.dtype)
        self.capacity = 0  # the buffers' slots per row now (fit() grows them)
        self.buffers: dict[str, Value] = {}  # cell -> [rows, ..., capacity, ...]
        self.plans: dict[tuple[int, int], PassPlan] = {}  # (rows, W) -> plan, W <= KEPT
        self.fit(min(CAPACITY_STEP, capacity))

    def fit(self, slots: int) -> None:
        """Buffers of at least ``slots`` positions per row (an attention pass reads every
        slot of the buffers it is bound to, so they are kept as short as the rows need):
        ``CAPACITY_STEP`` doubled until it covers ``slots``, at most ``max_capacity``. Growing
        copies each row's slots into the new buffers (rare: once per doubling) and drops the
        plans, which bound the old ones."""
        if slots <= self.capacity:
            return
        capacity = CAPACITY_STEP
        while capacity < slots:
            capacity *= 2
        capacity = min(capacity, self.max_capacity)
        seam, device = self.seam, self.session.device
        for name, (shape, axis, dtype) in self.shapes.items():
            grown = seam.zeros([capacity if a == axis else n for a, n in enumerate(shape)],
                               dtype, device)
            if self.capacity:
                copy_prefix(seam, self.buffers[name], grown, axis)
            self.buffers[name] = grown
        self.capacity = capacity
        self.plans.clear()

    def reserve(self, num_prompt: int, max_new_tokens: int, k: int) -> RowCells:
        """A request's row-to-be, reserving its bound ``P + max_new_tokens + k + 1`` (the
        buffers fit it when it takes a row), once that fits a row of the package's caches (a
        RequestError naming the numbers otherwise)."""
        bound, capacity = num_prompt + max_new_tokens + k + 1, self.max_capacity
        if bound > capacity:
            raise RequestError(
                f"the request needs {bound} cache slots (prompt {num_prompt} + max_new_tokens "
                f"{max_new_tokens} + k {k} + 1) but a row of the batched caches holds "
                f"{capacity}", path="max_new_tokens", value=bound,
                expected=f"prompt + max_new_tokens + k + 1 <= {capacity}",
                remedy=f"lower max_new_tokens to at most {max(capacity - num_prompt - k - 1, 0)}"
                       ", shorten the prompt, or lower k")
        return RowCells(bound)

    def run(self, blocks: Sequence[RowBlock]) -> list[PassResult]:
        """The step's passes over ``blocks`` (one per busy row); each row's
        :class:`PassResult`, in ``blocks``' order, its logits ``[1, W_b, V]``. A prompt chunk
        wider than :data:`KEPT_WIDTHS` runs alone on its row's view through the batch-1 graph
        (padding every other row to its width would cost each of them the chunk); the other
        rows run together, the first ``row_bucket`` rows of the buffers (free rows padding)."""
        alone = [b for b in blocks if self.single is not None and len(b.tokens) > KEPT_WIDTHS]
        together = [b for b in blocks if b not in alone]
        results: dict[int, PassResult] = {}
        for block in alone:
            results.update(self._pass([block], block.cells.row, 1))
        if together:
            results.update(self._pass(together, 0, row_bucket(
                max(block.cells.row for block in together), self.rows)))
        return [results[id(block)] for block in blocks]

    def _pass(self, blocks: Sequence[RowBlock], first: int, rows: int
              ) -> dict[int, PassResult]:
        """One pass over rows ``[first, first + rows)`` of the buffers (a view), holding
        ``blocks``; each block's result by ``id``."""
        width = max(len(block.tokens) for block in blocks)
        over = [(b.cells.row, b.start) for b in blocks if b.start + width > self.capacity]
        if over:
            raise ContractError(f"a batched pass of width {width} writes past the rows' "
                                f"capacity {self.capacity} at (row, start) {over}",
                                value=width, expected=f"start + {width} <= {self.capacity}")
        cursors = row_cursors(blocks, rows, first)  # free rows: cursor 0, block length 0
        tokens = np.zeros((rows, width), np.int64)
        for block in blocks:
            tokens[block.cells.row - first, :len(block.tokens)] = block.tokens
        values = {"cursors": cursors, "widths": row_widths(blocks, rows, width, first),
                  "tokens": tokens,
                  "positions": cursors[:, None] + np.arange(width, dtype=np.int64)[None]}
        plan = self._plan(first, rows, width)
        with self.seam.write_batch():
            for port, contract in self.inputs.items():
                if port in self.roles and port in plan.inputs:
                    plan.write(port, values[self.roles[port]].astype(
                        NUMPY_DTYPES[contract.dtype]))
        try:
            produced = plan.run()
            logits = produced[self.logits_port]  # [rows, W, V]
        except Exception as exc:  # ORT raises its own exception types; wrap them (A9)
            raise ContractError(f"ONNX Runtime failed a batched pass of {len(blocks)} row(s) "
                                f"of width {width}: {exc}", file=self.artifact,
                                path=self.field, remedy="decode the requests alone "
                                "(engine.generate), and report the package") from exc
        seed = produced.get(self.seed_port) if self.seed_port else None  # [rows, W, H]

        def row(value: Value, block: RowBlock) -> Value:  # [1, W_b, ...] of [rows, W, ...]
            return self.seam.truncate_axis(self.seam.slice_axis(
                value, 0, block.cells.row - first, 1), 1, len(block.tokens))

        argmax = PassArgmax(self.seam, logits)
        return {id(block): PassResult(block.start, block.tokens, {}, row(logits, block),
                                      None if seed is None else row(seed, block), block.cells,
                                      argmax.of(block.cells.row - first, len(block.tokens)))
                for block in blocks}

    def _plan(self, first: int, rows: int, width: int) -> PassPlan:
        """The plan of rows ``[first, first + rows)`` at width ``W``: the small inputs'
        buffers, those rows of the caches (a view) bound as past and present, and the logits
        ``[rows, W, V]``; one row runs the batch-1 graph; kept for the first rows' verify
        widths only."""
        plan = self.plans.get((rows, width)) if first == 0 else None
        if plan is not None:
            return plan
        seam, device = self.seam, self.session.device
        session = self.single if rows == 1 and self.single is not None else self.session
        inputs: dict[str, Value] = {}
        for port, contract in self.inputs.items():
            if session is self.single and self.roles.get(port) == "widths":
                continue  # the one row's block is the whole block
            if port in self.cell_of:
                inputs[port] = seam.owned_rows(self.buffers[self.cell_of[port]], first, rows)
            else:
                shape = (rows, width) if self.roles[port] in ("tokens", "positions") \
                    else (rows,)
                inputs[port] = seam.zeros(shape, contract.dtype, device)
        logits_dtype = self.session.ports.outputs[self.logits_port].dtype
        outputs = {port: inputs[self.cell_port[name]] for port, name in self.present_of.items()}
        outputs[self.logits_port] = seam.zeros((rows, width, self.vocab), logits_dtype,
                                               self.session.output_residency)
        if self.seed_port is not None:
            seed = self.session.ports.outputs[self.seed_port]
            outputs[self.seed_port] = seam.zeros((rows, width, seed.dims[-1]), seed.dtype,
                                                 self.session.output_residency)
        plan = PassPlan(session, inputs, outputs, capture=False)
        if first == 0 and width <= KEPT_WIDTHS:
            self.plans[rows, width] = plan
        return plan
