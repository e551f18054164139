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
from speculant.package.model import Document
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
        role_port = plan.port_by_role
        self.token_ids_value = plan.target_inputs[role_port["token_ids"]]
        self.logits_port = role_port.get("logits", "logits")
        self.seed_port = plan.chain.seed_output if plan.chain else None

    def run(self, tokens: Sequence[int], start: int, cells: Mapping[str, Value],
            admitted: Admitted) -> PassResult:
        n = len(tokens)
        values: dict[str, Value] = dict(admitted.fixed)
        values.update({self.plan.serving[c]: v for c, v in admitted.controls.items()})
        for value_name, what in self.plan.driver_bound.items():
            values[value_name] = self._driver_value(value_name, what, tokens, start, cells)

        symbols = SymbolTable(f"pass over {n} token(s) at C0={start}", self.dynamic)
        for name, value in values.items():
            symbols.check(name, self.inputs_spec[name].contract, value)
        for name, spec in admitted.defaults.items():
            values[name] = literal_value(name, spec, symbols.resolve(spec.contract, name))
            symbols.check(name, spec.contract, values[name])

        port_values = {port: values[name] for port, name in self.plan.target_inputs.items()}
        produced = self.session.invoke(port_values, list(self.plan.target_outputs), check=False)
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

    def _driver_value(self, name: str, what: str, tokens: Sequence[int], start: int,
                      cells: Mapping[str, Value]) -> Value:
        dtype = self.inputs_spec[name].contract.dtype
        n = len(tokens)
        if what == "token_ids":
            array = np.asarray([tokens], dtype=NUMPY_DTYPES[dtype])  # [1, n]
        elif what == "position_ids":
            array = np.arange(start, start + n, dtype=NUMPY_DTYPES[dtype])[None, :]  # [1, n]
        elif what == "attention_mask":
            array = np.ones((1, start + n), dtype=NUMPY_DTYPES[dtype])  # [1, C0 + n]
        else:  # "cell:<name>": the cell's current value, extent C0
            return cells[what.removeprefix("cell:")]
        return Value.host(array, dtype)
