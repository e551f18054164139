"""A pass: one run of the target's invoke over n tokens from C0 (docs/design/spec/runtime.md §4).

`TargetPass` binds the driver-bound inputs (token ids, position ids, attention mask, the cells),
the serving controls and the admitted values, checks them against their contracts with one
package-scope symbol table, runs the target through its `ComponentSession`, and keeps what
the round needs: the logits, the folded-carry seed, the presents and every value by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from speculant.errors import ContractError
from speculant.package.model import Document, WorkflowInput
from speculant.package.plan import LoadPlan
from speculant.session.contracts import SymbolTable
from speculant.session.plan import PassPlan
from speculant.session.session import ComponentSession
from speculant.tensors import HOST, NUMPY_DTYPES, TensorSeam, Value
from speculant.workflow.cells import AppendedCells, RowCells, StaticCells
from speculant.workflow.request import Admitted, literal_value


@dataclass(frozen=True)
class PassResult:
    """One pass, as the round reads it: built once the tokens it consumed are known (a pass
    queued on a device is rebuilt with them when it is read)."""

    start: int  # C0: the consumed count the pass started from
    tokens: tuple[int, ...]  # the n tokens it consumed
    values: dict[str, Value]  # every workflow value of the pass: bound inputs and outputs
    logits: Value  # [1, n, V] target scores, where the target executes
    seed: Value | None  # [1, n, W_C] the folded-carry seed output (chained packages)
    presents: AppendedCells | StaticCells | RowCells  # cell -> present (C0 + n) or buffer
    argmax: Callable[[], list[int]] | None = None  # its rows' argmax ids (batched_pass.py)

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class PendingPass(Protocol):
    """A row's pass queued with other rows' (speculative/scheduler.py): its result is known
    once their one batched pass has run."""

    def resolve(self) -> PassResult: ...


def resolved(launched: PassResult | PendingPass) -> PassResult:
    """The pass's result: itself, or a queued row's once its batched pass has run."""
    return launched if isinstance(launched, PassResult) else launched.resolve()


@dataclass(frozen=True)
class TokenIds:
    """The pass's tokens [1, n]."""

    dtype: str

    def value(self, tokens: Sequence[int], start: int, cells: Mapping[str, Value]) -> Value:
        return Value.host(np.asarray([tokens], dtype=NUMPY_DTYPES[self.dtype]), self.dtype)

    def write(self, seam: TensorSeam, buffer: Value, tokens: Sequence[int],
              drafts: Value | None, start: int | Value) -> None:
        seam.write_ints(buffer, tokens)  # the host's tokens, then the drafts where they are
        if drafts is not None:
            seam.write_ids(buffer, drafts, len(tokens))


@dataclass(frozen=True)
class PositionIds:
    """Positions C0 … C0 + n − 1 [1, n]."""

    dtype: str

    def value(self, tokens: Sequence[int], start: int, cells: Mapping[str, Value]) -> Value:
        array = np.arange(start, start + len(tokens), dtype=NUMPY_DTYPES[self.dtype])[None, :]
        return Value.host(array, self.dtype)

    def write(self, seam: TensorSeam, buffer: Value, tokens: Sequence[int],
              drafts: Value | None, start: int | Value) -> None:
        if isinstance(start, Value):  # C0 where the pass runs (a round queued behind another)
            seam.write_arange_from(buffer, start)
        else:
            seam.write_arange(buffer, start)


@dataclass(frozen=True)
class AttentionMask:
    """Ones over every position the pass attends to [1, C0 + n]."""

    dtype: str

    def value(self, tokens: Sequence[int], start: int, cells: Mapping[str, Value]) -> Value:
        array = np.ones((1, start + len(tokens)), dtype=NUMPY_DTYPES[self.dtype])
        return Value.host(array, self.dtype)

    def write(self, seam: TensorSeam, buffer: Value, tokens: Sequence[int],
              drafts: Value | None, start: int | Value) -> None:
        seam.write_ints(buffer, [1] * buffer.size)


@dataclass(frozen=True)
class CacheLengths:
    """L = C0, the valid length of static caches before the pass [1]."""

    dtype: str

    def value(self, tokens: Sequence[int], start: int, cells: Mapping[str, Value]) -> Value:
        return Value.host(np.full((1,), start, dtype=NUMPY_DTYPES[self.dtype]), self.dtype)

    def write(self, seam: TensorSeam, buffer: Value, tokens: Sequence[int],
              drafts: Value | None, start: int | Value) -> None:
        if isinstance(start, Value):
            seam.write_arange_from(buffer, start, step=0)
        else:
            seam.write_ints(buffer, [start] * buffer.size)


@dataclass(frozen=True)
class CellValue:
    """A state cell's current value (extent C0 on its sequence axis)."""

    cell: str

    def value(self, tokens: Sequence[int], start: int, cells: Mapping[str, Value]) -> Value:
        return cells[self.cell]


DriverSource = TokenIds | PositionIds | AttentionMask | CacheLengths | CellValue
ROLE_SOURCES = {"token_ids": TokenIds, "position_ids": PositionIds,
                "attention_mask": AttentionMask, "cache_lengths": CacheLengths}
UNREAD = -1  # a pass's token that was never read back (a draft kept on its device)
CELL_PREFIX = "cell:"  # how package/plan.py spells a cell in LoadPlan.driver_bound


def driver_sources(plan: LoadPlan, inputs_spec: Mapping[str, WorkflowInput]
                   ) -> tuple[tuple[str, DriverSource], ...]:
    """What the driver binds on every pass, as source objects, from the plan's spelling."""
    sources: list[tuple[str, DriverSource]] = []
    for value_name, what in plan.driver_bound.items():
        if what.startswith(CELL_PREFIX):
            sources.append((value_name, CellValue(what[len(CELL_PREFIX):])))
        else:
            sources.append((value_name,
                            ROLE_SOURCES[what](inputs_spec[value_name].contract.dtype)))
    return tuple(sources)


class TargetPass:
    """Runs passes of the target for one loaded package."""

    def __init__(self, document: Document, plan: LoadPlan, session: ComponentSession) -> None:
        self.plan = plan
        self.session = session
        wf = document.workflow
        self.inputs_spec = wf.inputs
        self.outputs_spec = wf.outputs
        self.emits = [(s.value, s.output) for s in wf.steps if s.kind == "emit"]
        self.dynamic = frozenset(
            dim for cell in plan.cells.values()
            for dim in (cell.contract.dims[cell.sequence_axis],
                        wf.inputs[cell.initializer].contract.dims[cell.sequence_axis])
            if isinstance(dim, str))
        self.driver_sources = driver_sources(plan, wf.inputs)  # compiled once
        # (port, value name, source) of every input a static pass writes into its plan
        sources = dict(self.driver_sources)
        self.written_inputs = tuple(
            (port, name, sources[name]) for port, name in plan.target_inputs.items()
            if name in sources and not isinstance(sources[name], CellValue))
        port_of = {name: port for port, name in plan.target_inputs.items()}
        self.control_ports = {control: port_of[name] for control, name in plan.serving.items()
                              if name in port_of}
        # rounds a decode may launch beyond the one the host reads (speculative/round.py):
        # one where the target runs on a device, none on the host
        self.queue_depth = int(session.device != HOST)
        self.logits_port = plan.port_by_role.get("logits", "logits")
        self.seed_port = plan.chain.seed_output if plan.chain else None

    def bind(self, tokens: Sequence[int], start: int, cells: Mapping[str, Value],
             admitted: Admitted, controls: Mapping[str, Value]
             ) -> tuple[dict[str, Value], SymbolTable]:
        """Every workflow value a pass over ``tokens`` from ``start`` binds, checked against
        its contract with one package-scope symbol table (returned for the outputs)."""
        n = len(tokens)
        values: dict[str, Value] = dict(admitted.fixed)
        values.update({self.plan.serving[c]: v for c, v in controls.items()})
        for value_name, source in self.driver_sources:
            values[value_name] = source.value(tokens, start, cells)

        symbols = SymbolTable(f"pass over {n} token(s) at C0={start}", self.dynamic)
        for name, value in values.items():
            symbols.check(name, self.inputs_spec[name].contract, value)
        for name, spec in admitted.defaults.items():
            values[name] = literal_value(name, spec, symbols.resolve(spec.contract, name))
            symbols.check(name, spec.contract, values[name])
        return values, symbols

    def port_values(self, values: Mapping[str, Value]) -> dict[str, Value]:
        """The target invoke's inputs by port, from the bound workflow values."""
        return {port: values[name] for port, name in self.plan.target_inputs.items()}

    def run(self, tokens: Sequence[int], start: int, cells: AppendedCells | StaticCells,
            admitted: Admitted, controls: Mapping[str, Value], *,
            drafts: Value | None = None, at: Value | None = None) -> PassResult:
        """One pass over ``tokens`` from position ``start`` with the caches ``cells`` and the
        serving ``controls`` as they stand (the decode state's). Static caches
        (:class:`StaticCells`) run through the plan of the block's width; there the block
        may end with ``drafts`` [k] int32 where the proposer made them (never read back: the
        pass's ``tokens`` then hold :data:`UNREAD` at their positions), and ``at`` [1] int32
        may give C0 where the pass runs (``start`` then bounds it: the capacity check)."""
        if cells.is_in_place:
            return run_static(self, tokens, start, cells, admitted, controls, drafts, at)
        if drafts is not None or at is not None:
            raise ContractError("drafts kept on their device need static caches (a pass over "
                                "appended caches binds host token ids)", path="drafts")
        n = len(tokens)
        values, symbols = self.bind(tokens, start, cells, admitted, controls)
        produced = self.session.invoke(self.port_values(values), list(self.plan.target_outputs),
                                       check=False)  # checked at package scope above
        for port, value in produced.items():
            values[self.plan.target_outputs[port]] = value
        for value_name, output_name in self.emits:
            symbols.check(f"output '{output_name}'", self.outputs_spec[output_name].contract,
                          values[value_name])

        presents = AppendedCells()
        for cell in self.plan.cells.values():
            present = produced[cell.owner_output]
            if present.shape[cell.sequence_axis] != start + n:
                raise ContractError(
                    f"present '{cell.owner_output}' of cell '{cell.name}' has extent "
                    f"{present.shape[cell.sequence_axis]} on axis {cell.sequence_axis} after a "
                    f"pass over {n} token(s) from C0={start}", path=cell.owner_output,
                    value=present.shape, expected=f"extent {start + n}")
            presents[cell.name] = present
        return PassResult(start, tuple(tokens), values, produced[self.logits_port],
                          produced.get(self.seed_port) if self.seed_port else None, presents)


def run_static(target: TargetPass, tokens: Sequence[int], start: int, cells: StaticCells,
               admitted: Admitted, controls: Mapping[str, Value],
               drafts: Value | None = None, at: Value | None = None) -> PassResult:
    """A pass on static caches (docs/design/static-cache.md): the plan of width ``n`` binds
    every cell's buffer as both its past and its present; the pass writes only the driver's
    small inputs (``input_ids``, ``position_ids``, ``cache_lengths``: through the seam, where
    the plan's buffers live, with no host buffer or upload) and the serving controls into
    the plan's buffers, runs, and the graph writes slots ``[C0, C0 + n)`` of each buffer in
    place. The first pass of a width is checked at package scope and makes the plan
    (:func:`static_plan`); later ones are not checked again."""
    block = [*tokens, *([UNREAD] * (drafts.size if drafts is not None else 0))]
    n = len(block)
    if start + n > cells.capacity:
        raise ContractError(f"a pass over {n} token(s) at C0={start} writes past the static "
                            f"caches' capacity {cells.capacity}", value=start + n,
                            expected=f"C0 + n <= {cells.capacity}")
    is_prefill = start == 0  # its width is the prompt's: a one-off plan, never kept or captured
    plan = None if is_prefill else cells.plans.get(n)
    if plan is None:  # checked with the block's shape; its ids are written below
        plan = static_plan(target, [max(t, 0) for t in block], start, cells, admitted,
                           controls, capture=not is_prefill)
        if not is_prefill:
            cells.plans[n] = plan
    seam = target.session.seam
    values: dict[str, Value] = {}
    with seam.write_batch():
        for port, value_name, source in target.written_inputs:
            buffer = plan.inputs[port]
            if isinstance(source, TokenIds | PositionIds) and buffer.shape[-1] != n:
                raise ContractError(
                    f"pass plan of component '{target.session.name}': '{port}' was planned as "
                    f"{list(buffer.shape)} {buffer.dtype}, got a block of {n} token(s)",
                    path=port, value=n, expected=f"{buffer.shape[-1]} token(s) (a plan of "
                    "this width; another width needs its own plan)")
            source.write(seam, buffer, tokens, drafts, start if at is None else at)
            values[value_name] = buffer
        for control, value in controls.items():
            if control in target.control_ports:
                plan.write(target.control_ports[control], value)
            values[target.plan.serving[control]] = value
    produced = plan.run()
    for port, value in produced.items():
        values[target.plan.target_outputs[port]] = value
    return PassResult(start, tuple(block), values, produced[target.logits_port],
                      produced.get(target.seed_port) if target.seed_port else None, cells)


def capture_widths(target: TargetPass, widths: Sequence[int], token: int, start: int,
                   cells: StaticCells, admitted: Admitted,
                   controls: Mapping[str, Value]) -> list[int]:
    """Run the static pass of each of ``widths`` that fits until its plan is captured,
    unobserved, then once more observed (a measurement of each width's pass); the widths
    run. Each writes only slots ``[start, start + n)``, past the valid length: no pass reads
    them before it writes them."""
    done = [n for n in widths if 0 < start and start + n <= cells.capacity]  # 0: a prefill
    with target.session.unobserved():
        for n in done:
            while n not in cells.plans or cells.plans[n].awaits_capture:
                run_static(target, [token] * n, start, cells, admitted, controls)
    for n in done:
        run_static(target, [token] * n, start, cells, admitted, controls)
    return done


def static_plan(target: TargetPass, tokens: Sequence[int], start: int, cells: StaticCells,
                admitted: Admitted, controls: Mapping[str, Value], *,
                capture: bool = True) -> PassPlan:
    """The plan of width ``len(tokens)``: the inputs checked against their contracts, each
    cell's buffer bound to its past and its present port, a buffer of its own for every
    other input (filled with this pass's value) and output (its contract's shape)."""
    plan = target.plan
    values, symbols = target.bind(tokens, start, cells, admitted, controls)
    session = target.session
    seam = session.seam
    present_of = {cell.owner_output: cell.name for cell in plan.cells.values()}
    buffers: dict[str, Value] = {}
    with seam.write_batch():
        for port, value_name in plan.target_inputs.items():
            value = values[value_name]
            if value_name in plan.driver_bound and \
                    plan.driver_bound[value_name].startswith(CELL_PREFIX):
                buffers[port] = value  # the cell's buffer itself
                continue
            buffer = seam.zeros(value.shape, value.dtype, session.device)
            buffers[port] = PassPlan.copy_into(session, port, buffer, value)
        outputs = {}
        for port in plan.target_outputs:
            if port in present_of:
                outputs[port] = cells[present_of[port]]  # present = past: one buffer
                continue
            contract = session.ports.outputs[port]
            outputs[port] = seam.zeros(symbols.resolve(contract, port), contract.dtype,
                                       session.output_residency)
    return PassPlan(session, buffers, outputs, capture=capture)
