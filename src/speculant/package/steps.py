"""The workflow steps (docs/design/spec/metadata.md §4.8): the SSA walk (rules 12–16), what
speculant executes of them (invoke and emit; the control steps are unsupported, rule 16), the invoke
bindings against the graphs (A5), and the bindings the plan takes from the invokes.

The SSA walk follows the standard's scoping. Values flow through a ``sequence`` as through
the top level. A ``loop`` republishes its ``setup`` outputs and the cells it carries (the
cell's name is its value after the loop); its body sees those, the iteration value, and the
values before it, and keeps its own definitions to itself. A ``branch`` publishes the keys of
its ``outputs`` (each a ``{cases, default}`` map); a case keeps its own definitions.
"""

from __future__ import annotations

import onnx

from speculant.errors import AdmissionError, MetadataError, ProblemCollector, UnsupportedError
from speculant.package.common import (
    WF,
    component_roles,
    declares_ports,
    describe,
    incompatibility,
    invokes_of,
    ports_of,
    unsupported,
)
from speculant.package.graphs import graph_ports
from speculant.package.model import Document, Step, TensorContract, Workflow

CONTROL_STEP_KINDS = ("sequence", "loop", "branch")
Values = dict[str, TensorContract | None]  # defined value -> its contract (None: unknown)


def check(doc: Document, out: ProblemCollector) -> Values:
    """Walk the steps in order (SSA); return every value defined at the top level with its
    contract. Records rules 12–16 (M) and the step forms speculant does not execute (U)."""
    wf = doc.workflow
    values: Values = {n: i.contract for n, i in wf.inputs.items()}
    _walk(wf, wf.steps, f"{WF}.steps", values, out)
    _check_support(doc, out)
    return values


def _walk(wf: Workflow, steps: list[Step], path: str, values: Values,
          out: ProblemCollector) -> None:
    for index, step in enumerate(steps):
        where = f"{path}.{index}"
        if step.kind == "invoke":
            _check_invoke(wf, step, where, values, out)
        elif step.kind == "emit":
            _check_emit(wf, step, where, values, out)
        elif step.kind == "sequence":
            _walk(wf, step.steps or [], f"{where}.steps", values, out)
        elif step.kind == "loop":
            _walk_loop(wf, step, where, values, out)
        elif step.kind == "branch":
            _walk_branch(wf, step, where, values, out)
        else:
            out.add(MetadataError, f"unknown step kind '{step.kind}' at {where}",
                    path=f"{where}.kind", value=step.kind, rule="16",
                    expected="invoke, emit, sequence, loop or branch")


def _walk_loop(wf: Workflow, step: Step, path: str, values: Values,
               out: ProblemCollector) -> None:
    _walk(wf, step.setup or [], f"{path}.setup", values, out)  # republished after the loop
    carried = step.carried or []
    body: Values = dict(values)
    for index, carry in enumerate(carried):
        cell = wf.state.get(carry.cell)
        if cell is None:
            out.add(MetadataError, f"loop carries an unknown state cell '{carry.cell}'",
                    path=f"{path}.carried.{index}.cell", value=carry.cell, rule="12",
                    expected="one of " + (", ".join(wf.state) or "(no cells declared)"))
        body[carry.cell] = cell.contract if cell is not None else None
    iteration = step.iteration
    if isinstance(iteration, dict) and isinstance(iteration.get("value"), str):
        body[iteration["value"]] = None
    _walk(wf, step.steps or [], f"{path}.steps", body, out)
    for index, carry in enumerate(carried):
        if carry.next not in body:
            out.add(MetadataError, f"loop carry of '{carry.cell}' names '{carry.next}', which "
                    "the body does not define", path=f"{path}.carried.{index}.next",
                    value=carry.next, rule="12", expected="a value the loop body defines")
        values.setdefault(carry.cell, body.get(carry.cell))


def _walk_branch(wf: Workflow, step: Step, path: str, values: Values,
                 out: ProblemCollector) -> None:
    scopes: dict[str, Values] = {}
    for case, inner in (step.cases or {}).items():
        scopes[case] = dict(values)
        _walk(wf, [inner], f"{path}.cases.{case}", scopes[case], out)
    if step.default is not None:
        scopes[""] = dict(values)
        _walk(wf, [step.default], f"{path}.default", scopes[""], out)
    for name, output in (step.outputs or {}).items():
        if isinstance(output, str):
            continue  # refused by the model
        where = f"{path}.outputs.{name}"
        if name in values:
            out.add(MetadataError, f"SSA value '{name}' is defined twice", path=where,
                    value=name, expected="a new value name", rule="12")
            continue
        contract = next((scopes[c].get(v) for c, v in output.cases.items() if c in scopes), None)
        values[name] = contract


def _check_invoke(wf: Workflow, step: Step, path: str, values: Values,
                  out: ProblemCollector) -> None:
    component = wf.components.get(step.component or "")
    if component is None:
        out.add(MetadataError, f"invoke of an unknown component '{step.component}'",
                path=f"{path}.component", value=step.component, rule="13",
                expected="one of " + ", ".join(wf.components))
    inputs, outputs = ports_of(component)
    check_ports = declares_ports(component)
    bound_in, bound_out = step.inputs or {}, step.invoke_outputs()
    for port, value in bound_in.items():
        where = f"{path}.inputs.{port}"
        if value not in values:
            out.add(MetadataError, f"value '{value}' is used before it is defined", path=where,
                    value=value, expected="a workflow input or an earlier invoke output",
                    rule="12")
        if check_ports and port not in inputs:
            out.add(MetadataError, f"'{port}' is not a declared input port of "
                    f"'{step.component}'", path=where, value=port, rule="13",
                    expected="one of " + ", ".join(inputs))
            continue
        have = values.get(value)
        if check_ports and have is not None:
            reason = incompatibility(have, inputs[port])
            if reason:
                out.add(MetadataError, f"value '{value}' ({describe(have)}) does not fit input "
                        f"port '{port}' ({describe(inputs[port])}): {reason}", path=where,
                        value=value, expected=describe(inputs[port]), rule="14")
    for port, value in bound_out.items():
        where = f"{path}.outputs.{port}"
        if check_ports and port not in outputs:
            out.add(MetadataError, f"'{port}' is not a declared output port of "
                    f"'{step.component}'", path=where, value=port, rule="13",
                    expected="one of " + ", ".join(outputs))
        if value in values:
            out.add(MetadataError, f"SSA value '{value}' is defined twice", path=where,
                    value=value, expected="a new value name", rule="12")
            continue
        values[value] = outputs.get(port)
    for ports, bound, side in ((inputs, bound_in, "inputs"), (outputs, bound_out, "outputs")):
        for port, contract in ports.items():
            if port not in bound and not contract.optional:
                out.add(MetadataError, f"invoke of '{step.component}' leaves the non-optional "
                        f"{side[:-1]} port '{port}' unbound", path=f"{path}.{side}.{port}",
                        expected=f"a binding for '{port}'", rule="13")


def _check_emit(wf: Workflow, step: Step, path: str, values: Values,
                out: ProblemCollector) -> None:
    if step.value not in values:
        out.add(MetadataError, f"emit of value '{step.value}', which is not defined before it",
                path=f"{path}.value", value=step.value, rule="12",
                expected="a workflow input, an earlier invoke output or a value a preceding "
                "control step publishes")
    output = wf.outputs.get(step.output or "")
    if output is None:
        out.add(MetadataError, f"emit to an undeclared output '{step.output}'",
                path=f"{path}.output", value=step.output, rule="15",
                expected="one of " + ", ".join(wf.outputs))
        return
    have = values.get(step.value or "")
    if have is None:
        return
    reason = incompatibility(have, output.contract)
    if reason:
        out.add(MetadataError, f"emitted value '{step.value}' ({describe(have)}) does not fit "
                f"output '{step.output}' ({describe(output.contract)}): {reason}",
                path=f"{path}.value", value=step.value, expected=describe(output.contract),
                rule="15")
    elif have.batch_layout != output.contract.batch_layout:
        out.add(MetadataError, f"emitted value '{step.value}' and output '{step.output}' have "
                "different batch layouts", path=f"{path}.value", rule="15",
                value=have.batch_layout.model_dump(exclude_none=True),
                expected=str(output.contract.batch_layout.model_dump(exclude_none=True)))


# -- what speculant executes (rules 15, 16: U) ----------------------------------------------
def _check_support(doc: Document, out: ProblemCollector) -> None:
    wf = doc.workflow
    target, proposer = component_roles(doc)
    proposer_values: set[str] = set()
    for index, step in enumerate(wf.steps):
        path = f"{WF}.steps.{index}"
        if step.kind in CONTROL_STEP_KINDS:
            out.add(UnsupportedError, f"unsupported step kind '{step.kind}' at {path}; "
                    "speculant executes invoke and emit steps only", path=f"{path}.kind",
                    value=step.kind, expected="invoke or emit", rule="16")
        elif step.kind == "invoke" and step.component == proposer:
            proposer_values.update(step.invoke_outputs().values())
        elif step.kind == "emit":
            if step.mode not in (None, "replace"):
                unsupported(out, "2", f"emit mode '{step.mode}'", f"{path}.mode", step.mode,
                            "replace")
            for key in ("axis", "when", "valid_length"):
                if getattr(step, key) is not None:
                    unsupported(out, "2", f"emit {key}", f"{path}.{key}", getattr(step, key),
                                "absent")
            if step.value in proposer_values:
                unsupported(out, "15", f"an emit of proposer output '{step.value}'",
                            f"{path}.value", step.value, "a target output")
    for role, component in (("target", target), ("proposer", proposer)):
        if component is None:
            continue
        count = len(invokes_of(wf, component))
        if count != 1:
            unsupported(out, "16", f"{count} invokes of the {role} '{component}'", f"{WF}.steps",
                        count, f"exactly one invoke of the {role}")


# -- admission: A5 --------------------------------------------------------------------------
def admit(doc: Document, graphs: dict[str, onnx.ModelProto], files: dict[str, str],
          out: ProblemCollector) -> None:
    """A5: bindings name graph ports; unbound graph inputs have initializer defaults."""
    for index, step in enumerate(doc.workflow.steps):
        if step.kind == "invoke" and step.component in graphs:
            _admit_invoke(index, step, graphs[step.component], files[step.component], out)


def _admit_invoke(index: int, step: Step, model: onnx.ModelProto, file: str,
                  out: ProblemCollector) -> None:
    path = f"{WF}.steps.{index}"
    graph_inputs, graph_outputs = graph_ports(model)
    initializers = {t.name for t in model.graph.initializer}
    initializers |= {t.values.name for t in model.graph.sparse_initializer}
    bound_in, bound_out = step.inputs or {}, step.invoke_outputs()
    for side, bound, graph in (("input", bound_in, graph_inputs),
                               ("output", bound_out, graph_outputs)):
        for port in bound:
            if port not in graph:
                out.add(AdmissionError, f"invoke of '{step.component}' binds '{port}', which is "
                        f"not an {side} of its ONNX graph", path=f"{path}.{side}s.{port}",
                        file=file, value=port, rule="A5",
                        expected="one of " + (", ".join(graph) or "(none)"))
    for name in graph_inputs:
        if name and name not in bound_in and name not in initializers:
            out.add(AdmissionError, f"invoke of '{step.component}' leaves graph input '{name}' "
                    "unbound, and it has no initializer default", path=f"{path}.inputs.{name}",
                    file=file, expected=f"a binding for '{name}'", rule="A5")


# -- what load derives ----------------------------------------------------------------------
def invoke_bindings(doc: Document, component: str | None) -> tuple[dict[str, str],
                                                                   dict[str, str]]:
    """(port -> value, port -> value) of the component's invoke (empty if it has none)."""
    found = invokes_of(doc.workflow, component)
    if not found:
        return {}, {}
    step = found[0][1]
    return dict(step.inputs or {}), step.invoke_outputs()
