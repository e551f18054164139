"""A pass: one execution of the target's invoke over n tokens from position C0 (runtime.md §4).

`TargetPass` binds the driver-bound inputs (token ids, position ids, attention mask, the cells),
the serving controls and the admitted values, checks them against their contracts with one
package-scope symbol table, runs the target through its `ComponentSession`, and keeps what
the round needs: the logits, the folded-carry seed, the presents and every value by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from speculant.errors import ContractError
from speculant.package.model import Document, WorkflowInput
from speculant.package.plan import LoadPlan
from speculant.session.contracts import SymbolTable
from speculant.session.session import ComponentSession
from speculant.tensors import NUMPY_DTYPES, Value
from speculant.workflow.request import Admitted, literal_value


@dataclass
class PassResult:
    start: int  # C0: the consumed count the pass started from
    tokens: tuple[int, ...]  # the n tokens it consumed
    values: dict[str, Value]  # every workflow value of the pass: bound inputs and outputs
    logits: Value  # [1, n, V] target scores, where the target executes
    seed: Value | None  # [1, n, W_C] the folded-carry seed output (chained packages)
    presents: dict[str, Value]  # cell -> owner output, extent C0 + n on its sequence axis

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class TokenIds:
    """The pass's tokens [1, n]."""

    dtype: str

    def value(self, tokens: Sequence[int], start: int, cells: Mapping[str, Value]) -> Value:
        return Value.host(np.asarray([tokens], dtype=NUMPY_DTYPES[self.dtype]), self.dtype)


@dataclass(frozen=True)
class PositionIds:
    """Positions C0 … C0 + n − 1 [1, n]."""

    dtype: str

    def value(self, tokens: Sequence[int], start: int, cells: Mapping[str, Value]) -> Value:
        array = np.arange(start, start + len(tokens), dtype=NUMPY_DTYPES[self.dtype])[None, :]
        return Value.host(array, self.dtype)


@dataclass(frozen=True)
class AttentionMask:
    """Ones over every position the pass attends to [1, C0 + n]."""

    dtype: str

    def value(self, tokens: Sequence[int], start: int, cells: Mapping[str, Value]) -> Value:
        array = np.ones((1, start + len(tokens)), dtype=NUMPY_DTYPES[self.dtype])
        return Value.host(array, self.dtype)


@dataclass(frozen=True)
class CellValue:
    """A state cell's current value (extent C0 on its sequence axis)."""

    cell: str

    def value(self, tokens: Sequence[int], start: int, cells: Mapping[str, Value]) -> Value:
        return cells[self.cell]


DriverSource = TokenIds | PositionIds | AttentionMask | CellValue
ROLE_SOURCES = {"token_ids": TokenIds, "position_ids": PositionIds,
                "attention_mask": AttentionMask}
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

    def run(self, tokens: Sequence[int], start: int, cells: Mapping[str, Value],
            admitted: Admitted, controls: Mapping[str, Value]) -> PassResult:
        """One pass over ``tokens`` from position ``start`` with the caches ``cells`` and the
        serving ``controls`` as they stand (the decode state's)."""
        n = len(tokens)
        values, symbols = self.bind(tokens, start, cells, admitted, controls)
        produced = self.session.invoke(self.port_values(values), list(self.plan.target_outputs),
                                       check=False)  # checked at package scope above
        for port, value in produced.items():
            values[self.plan.target_outputs[port]] = value
        for value_name, output_name in self.emits:
            symbols.check(f"output '{output_name}'", self.outputs_spec[output_name].contract,
                          values[value_name])

        presents = {}
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
