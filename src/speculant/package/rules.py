"""The `MetadataError` rules of the validation checklist (metadata.md §6, rules 1–36, "M").

``validate_document`` needs only the typed document: it is what ``inspect --metadata-only``
runs, and every published document in ``../shared/conformance`` passes it. The
``UnsupportedError`` conditions (what a valid document may say but speculant cannot execute)
live in ``package.support``; the checks that need the folder (P2, P3) in ``package.paths``.
Rules 1, 2 (unknown keys) and 6 are enforced while parsing (``package.document`` and the
models); the rest are here, each recorded with its document path, value and expectation.
Every check tolerates a document that breaks other rules, so that all findings are reported
together (metadata.md §1 rule 3).
"""

from __future__ import annotations

import math
from pathlib import PurePosixPath

from speculant.errors import MetadataError, Problem, ProblemCollector, shown
from speculant.package.model import (
    Component,
    Document,
    StateCell,
    TensorContract,
    Workflow,
)
from speculant.package.paths import check_lexical

WF = "pipeline.workflow"
SV = f"{WF}.serving"
SUPPORTED_CAPABILITIES = ("workflow_ssa", "typed_emit", "serving_service_contract",
                          "bounded_state_recurrence")
ARTIFACT_SUFFIXES = (".onnx", ".onnx.textproto")
ATTENTION_KINDS = ("full_attention", "sliding_attention", "multi_latent_attention")
INTEGER_DTYPES = {"int8": (-2**7, 2**7 - 1), "int16": (-2**15, 2**15 - 1),
                  "int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1),
                  "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1), "uint32": (0, 2**32 - 1),
                  "uint64": (0, 2**64 - 1)}
UPDATE_KEYS = {"append": set(), "replace": set(),
               "indexed_scatter": {"write_indices", "capacity", "write_indices_ports",
                                   "kv_length_ports"}}
IMPLEMENTATION_KEYS = {"onnx": set(), "adapter": {"abi", "version"}, "binding": set()}


def validate_document(doc: Document, file: str = "") -> list[Problem]:
    """Every `MetadataError` of §6 this document earns (empty when it is valid)."""
    out = ProblemCollector(file)
    _check_top_level(doc, out)
    if doc.pipeline is None:
        if doc.speculative is not None:
            out.add(MetadataError, "a 'speculative' section needs pipeline.workflow",
                    path="speculative", expected="a pipeline.workflow section")  # rule 26
        return out.problems
    wf = doc.workflow
    _check_inputs(wf, out)
    _check_components(wf, out)
    values = _check_steps(wf, out)
    _check_state(wf, values, out)
    _check_serving(wf, values, out)
    _check_speculative(doc, out)
    _check_capabilities(wf, out)
    return out.problems


# -- shared helpers -----------------------------------------------------------------------
def incompatibility(have: TensorContract, want: TensorContract) -> str | None:
    """Why a value of contract ``have`` cannot fill ``want`` (rule 14's test), or ``None``:
    dtype, rank, or an axis fixed on both sides."""
    if have.dtype != want.dtype:
        return f"dtype {have.dtype} != {want.dtype}"
    if have.rank != want.rank:
        return f"rank {have.rank} != {want.rank}"
    for axis, (a, b) in enumerate(zip(have.dims, want.dims, strict=True)):
        if isinstance(a, int) and isinstance(b, int) and a != b:
            return f"axis {axis} is fixed to {a} != {b}"
    return None


def describe(contract: TensorContract) -> str:
    """``float16[batch, sequence, 32]`` (``?`` for an unknown extent)."""
    dims = ", ".join("?" if d is None else str(d) for d in contract.dims)
    return f"{contract.dtype}[{dims}]"


def last_extent(contract: TensorContract | None) -> int | None:
    if contract is None or not contract.dims:
        return None
    dim = contract.dims[-1]
    return dim if isinstance(dim, int) else None


def is_integer_scalar(contract: TensorContract, *, per_row: bool = False) -> bool:
    """Rank 0, or rank 1 of shape ``[1]`` (``per_row``: or one request row, ``[batch]``)."""
    if contract.dtype not in INTEGER_DTYPES:
        return False
    if contract.rank == 0:
        return True
    if contract.rank != 1:
        return False
    if contract.dims[0] == 1:
        return True
    layout = contract.batch_layout
    return per_row and layout.kind == "request_aligned" and layout.axis == 0


def groups_of(wf: Workflow) -> dict:
    return dict(wf.serving.state_service.groups) if wf.serving else {}


def declares_ports(component: Component | None) -> bool:
    """False for "inferred" ports (none declared): unsupported, and nothing to check here."""
    ports = component.ports if component is not None else None
    return ports is not None and bool(ports.inputs or ports.outputs)


def ports_of(component: Component | None) -> tuple[dict, dict]:
    if component is None or component.ports is None:
        return {}, {}
    return component.ports.inputs, component.ports.outputs


# -- top level, tokenizer -----------------------------------------------------------------
def _check_top_level(doc: Document, out: ProblemCollector) -> None:
    if doc.pipeline is not None and doc.model is not None and doc.model.io is not None:
        out.add(MetadataError, "model.io cannot be combined with a pipeline section",
                path="model.io", value=doc.model.io,
                expected="no model.io in a workflow package")  # rule 3
    tokenizer = doc.package.tokenizer if doc.package else None
    if tokenizer is None or not tokenizer.artifacts:
        return
    for index, artifact in enumerate(tokenizer.artifacts):  # rule 4, P1
        check_lexical(artifact.location, f"package.tokenizer.artifacts.{index}.location", out)
    if canonical_tokenizer(tokenizer.artifacts) is None:  # rule 5
        out.add(MetadataError,
                "no canonical tokenizer artifact: none is named tokenizer.json and there are "
                f"{len(tokenizer.artifacts)}", path="package.tokenizer.artifacts",
                value=[a.location for a in tokenizer.artifacts],
                expected="an artifact named tokenizer.json, or exactly one artifact")


def canonical_tokenizer(artifacts: list) -> int | None:
    """Index of the declared tokenizer artifact speculant uses (§2.4), or ``None``."""
    for index, artifact in enumerate(artifacts):
        if PurePosixPath(artifact.location.replace("\\", "/")).name == "tokenizer.json":
            return index
    return 0 if len(artifacts) == 1 else None


# -- workflow inputs (rules 7, 8) ---------------------------------------------------------
def _check_inputs(wf: Workflow, out: ProblemCollector) -> None:
    for name, spec in wf.inputs.items():
        path = f"{WF}.inputs.{name}"
        role = spec.role
        if role.kind == "semantic":
            out.add(MetadataError, "an input role is {kind: runtime, version, role} or "
                    "{kind: opaque}", path=f"{path}.role.kind", value=role.kind,
                    expected="runtime or opaque")
        if role.kind == "runtime":
            for key in ("version", "role"):
                if getattr(role, key) is None:
                    out.add(MetadataError, f"a runtime role needs '{key}'",
                            path=f"{path}.role.{key}", expected=f"a value for '{key}'")
        elif role.kind != "runtime" and spec.source.kind == "request":
            out.add(MetadataError, "an input with a request source needs a runtime role",
                    path=f"{path}.role", value=role.kind,
                    expected="{kind: runtime, version, role}")  # rule 7
        if not spec.required and spec.default is None:
            out.add(MetadataError, "an input with required: false needs a default",
                    path=f"{path}.default", expected="a literal default")  # rule 7
        if spec.default is not None:
            reason = default_problem(spec.contract, spec.default)
            if reason:
                out.add(MetadataError, f"bad literal default: {reason}", path=f"{path}.default",
                        value=spec.default,
                        expected=f"a scalar or row-major list for {describe(spec.contract)}")


def default_problem(contract: TensorContract, default: object) -> str | None:
    """Rule 8: why ``default`` cannot initialize ``contract``, or ``None``."""
    values = default if isinstance(default, list) else [default]
    for value in values:
        if contract.dtype == "bool":
            ok = isinstance(value, bool)
        elif contract.dtype in INTEGER_DTYPES:
            ok = isinstance(value, int) and not isinstance(value, bool)
            if ok:
                low, high = INTEGER_DTYPES[contract.dtype]
                if not low <= value <= high:  # type: ignore[operator]
                    return f"{value} is out of range for {contract.dtype} [{low}, {high}]"
        else:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok:
            return f"{shown(value)} ({type(value).__name__}) is not a {contract.dtype} element"
    if isinstance(default, list):
        dims = contract.dims
        if all(isinstance(d, int) for d in dims):
            count = math.prod(dims)  # type: ignore[arg-type]
            if len(default) != count:
                return (f"a list of {len(default)} elements for shape {dims} "
                        f"({count} elements)")
    return None


# -- components (rules 4, 9, 10) ----------------------------------------------------------
def _check_components(wf: Workflow, out: ProblemCollector) -> None:
    for name, component in wf.components.items():
        path = f"{WF}.components.{name}"
        if not name or "." in name:
            out.add(MetadataError, "a component name is non-empty and contains no '.'",
                    path=path, value=name, expected="a name without '.'")  # rule 9
        impl = component.implementation
        for key in sorted(set(impl.model_extra or {}) - IMPLEMENTATION_KEYS[impl.kind]):
            out.add(MetadataError, f"unknown key '{key}'", path=f"{path}.implementation.{key}",
                    value=(impl.model_extra or {})[key],
                    expected=f"the keys of a {impl.kind} implementation")
        if impl.kind == "onnx":
            _check_artifact(impl.artifact, f"{path}.implementation.artifact", out)
        inputs, outputs = ports_of(component)
        if component.ports is not None and declares_ports(component):
            for port in component.ports.roles:  # rule 10
                if port not in inputs and port not in outputs:
                    out.add(MetadataError, f"role names '{port}', which is not a declared port "
                            f"of '{name}'", path=f"{path}.ports.roles.{port}", value=port,
                            expected="a key of ports.inputs or ports.outputs")
        if component.contract is not None:
            for role, port in component.contract.bindings.items():
                if port not in inputs and port not in outputs:
                    out.add(MetadataError, f"contract binding '{role}' names '{port}', which is "
                            f"not a declared port of '{name}'",
                            path=f"{path}.contract.bindings.{role}", value=port,
                            expected="a key of ports.inputs or ports.outputs")


def _check_artifact(artifact: str | None, path: str, out: ProblemCollector) -> None:
    if not artifact:
        out.add(MetadataError, "an onnx implementation needs a non-empty artifact", path=path,
                value=artifact, expected="a relative path ending in .onnx or .onnx.textproto")
        return
    if not check_lexical(artifact, path, out):
        return
    if not artifact.endswith(ARTIFACT_SUFFIXES):
        out.add(MetadataError, f"artifact '{artifact}' is neither .onnx nor .onnx.textproto",
                path=path, value=artifact, expected="a name ending in .onnx or .onnx.textproto")


# -- steps (rules 12–16) ------------------------------------------------------------------
def _check_steps(wf: Workflow, out: ProblemCollector) -> dict[str, TensorContract | None]:
    """Walk the steps in order (SSA); return every defined value with its contract."""
    values: dict[str, TensorContract | None] = {n: i.contract for n, i in wf.inputs.items()}
    for index, step in enumerate(wf.steps):
        path = f"{WF}.steps.{index}"
        if step.kind == "invoke":
            _check_invoke(wf, step, path, values, out)
        elif step.kind == "emit":
            _check_emit(wf, step, path, values, out)
        elif step.kind not in ("sequence", "loop", "branch"):  # those three: support (U)
            out.add(MetadataError, f"unknown step kind '{step.kind}' at {path}",
                    path=f"{path}.kind", value=step.kind,
                    expected="invoke or emit")  # rule 16
    return values


def _check_invoke(wf: Workflow, step, path: str, values: dict, out: ProblemCollector) -> None:
    component = wf.components.get(step.component or "")
    if component is None:
        out.add(MetadataError, f"invoke of an unknown component '{step.component}'",
                path=f"{path}.component", value=step.component,
                expected="one of " + ", ".join(wf.components))  # rule 13
    inputs, outputs = ports_of(component)
    check_ports = declares_ports(component)
    bound_in, bound_out = step.inputs or {}, step.outputs or {}
    for port, value in bound_in.items():
        where = f"{path}.inputs.{port}"
        if value not in values:
            out.add(MetadataError, f"value '{value}' is used before it is defined", path=where,
                    value=value, expected="a workflow input or an earlier invoke output")
        if check_ports and port not in inputs:
            out.add(MetadataError, f"'{port}' is not a declared input port of "
                    f"'{step.component}'", path=where, value=port,
                    expected="one of " + ", ".join(inputs))  # rule 13
            continue
        have = values.get(value)
        if check_ports and have is not None:
            reason = incompatibility(have, inputs[port])
            if reason:
                out.add(MetadataError, f"value '{value}' ({describe(have)}) does not fit input "
                        f"port '{port}' ({describe(inputs[port])}): {reason}", path=where,
                        value=value, expected=describe(inputs[port]))  # rule 14
    for port, value in bound_out.items():
        where = f"{path}.outputs.{port}"
        if check_ports and port not in outputs:
            out.add(MetadataError, f"'{port}' is not a declared output port of "
                    f"'{step.component}'", path=where, value=port,
                    expected="one of " + ", ".join(outputs))  # rule 13
        if value in values:
            out.add(MetadataError, f"SSA value '{value}' is defined twice", path=where,
                    value=value, expected="a new value name")  # rule 12
            continue
        values[value] = outputs.get(port)
    for ports, bound, side in ((inputs, bound_in, "inputs"), (outputs, bound_out, "outputs")):
        for port, contract in ports.items():
            if port not in bound and not contract.optional:
                out.add(MetadataError, f"invoke of '{step.component}' leaves the non-optional "
                        f"{side[:-1]} port '{port}' unbound", path=f"{path}.{side}.{port}",
                        expected=f"a binding for '{port}'")  # rule 13


def _check_emit(wf: Workflow, step, path: str, values: dict, out: ProblemCollector) -> None:
    if step.value not in values:
        out.add(MetadataError, f"emit of value '{step.value}', which is not defined before it",
                path=f"{path}.value", value=step.value,
                expected="a workflow input or an earlier invoke output")  # rule 12
    output = wf.outputs.get(step.output or "")
    if output is None:
        out.add(MetadataError, f"emit to an undeclared output '{step.output}'",
                path=f"{path}.output", value=step.output,
                expected="one of " + ", ".join(wf.outputs))  # rule 15
        return
    have = values.get(step.value or "")
    if have is None:
        return
    reason = incompatibility(have, output.contract)
    if reason:
        out.add(MetadataError, f"emitted value '{step.value}' ({describe(have)}) does not fit "
                f"output '{step.output}' ({describe(output.contract)}): {reason}",
                path=f"{path}.value", value=step.value, expected=describe(output.contract))
    elif have.batch_layout != output.contract.batch_layout:
        out.add(MetadataError, f"emitted value '{step.value}' and output '{step.output}' have "
                "different batch layouts", path=f"{path}.value",
                value=have.batch_layout.model_dump(exclude_none=True),
                expected=str(output.contract.batch_layout.model_dump(exclude_none=True)))


# -- state (rules 17–19) ------------------------------------------------------------------
def _check_state(wf: Workflow, values: dict, out: ProblemCollector) -> None:
    groups = groups_of(wf)
    accepted_len = wf.serving.accepted_len if wf.serving else None
    for name, cell in wf.state.items():
        path = f"{WF}.state.{name}"
        if cell.initializer not in values:
            out.add(MetadataError, f"initializer '{cell.initializer}' is not a defined value",
                    path=f"{path}.initializer", value=cell.initializer,
                    expected="a workflow input")
        if cell.service_group is not None:
            if cell.service_group not in groups:
                out.add(MetadataError, f"cell names an unknown state group "
                        f"'{cell.service_group}'", path=f"{path}.service_group",
                        value=cell.service_group,
                        expected="one of " + (", ".join(groups) or "no groups (none declared)"))
            if cell.management != "runtime":
                out.add(MetadataError, "a cell in a state group must be management: runtime",
                        path=f"{path}.management", value=cell.management, expected="runtime")
            if cell.contract.batch_layout.kind != "request_aligned":
                out.add(MetadataError, "a cell in a state group must be request_aligned",
                        path=f"{path}.contract.batch_layout", value=cell.contract.batch_layout
                        .kind, expected="{kind: request_aligned, axis}")  # rule 18
        if cell.management == "runtime" and cell.release_boundary is None:
            out.add(MetadataError, "a runtime-managed cell needs a release_boundary",
                    path=f"{path}.release_boundary", expected="invocation")
        _check_recurrence(name, cell, groups.get(cell.service_group or ""), accepted_len,
                          values, out)


def _check_recurrence(name: str, cell: StateCell, group, accepted_len: str | None,
                      values: dict, out: ProblemCollector) -> None:
    path = f"{WF}.state.{name}.recurrence"
    rec = cell.recurrence
    if rec.axis is not None and rec.axis >= cell.contract.rank:
        out.add(MetadataError, f"recurrence axis {rec.axis} is not below the cell's rank "
                f"{cell.contract.rank}", path=f"{path}.axis", value=rec.axis,
                expected=f"an axis < {cell.contract.rank}")
    if rec.kind in ("growing", "bounded") and group is not None:
        if group.sequence_axis is None:
            out.add(MetadataError, f"the recurrence varies axis {rec.axis} but group "
                    f"'{cell.service_group}' declares no sequence_axis", path=f"{path}.axis",
                    value=rec.axis, expected="a group with sequence_axis")
        elif rec.axis != group.sequence_axis:
            out.add(MetadataError, f"recurrence axis {rec.axis} differs from the sequence_axis "
                    f"{group.sequence_axis} of group '{cell.service_group}'",
                    path=f"{path}.axis", value=rec.axis, expected=str(group.sequence_axis))
    if rec.kind == "growing" and rec.increment != accepted_len:
        out.add(MetadataError, "a growing recurrence's increment is the value "
                "serving.accepted_len names", path=f"{path}.increment", value=rec.increment,
                expected=str(accepted_len))  # rule 19
    for key in ("max", "increment"):
        value = getattr(rec, key)
        if value is None or rec.kind == "invariant":
            continue
        contract = values.get(value)
        if value not in values:
            out.add(MetadataError, f"recurrence {key} '{value}' is not a defined value",
                    path=f"{path}.{key}", value=value, expected="a workflow input")
        elif contract is not None and not is_integer_scalar(contract,
                                                              per_row=key == "increment"):
            out.add(MetadataError, f"recurrence {key} '{value}' is not an integer scalar "
                    f"({describe(contract)})", path=f"{path}.{key}", value=value,
                    expected="an integer input of rank 0 or shape [1]")


# -- serving, groups, aliases (rules 20–24) -----------------------------------------------
CONTROL_DTYPES = {"active": ("bool",), "done": ("bool",), "accepted_len": tuple(INTEGER_DTYPES)}


def _check_serving(wf: Workflow, values: dict, out: ProblemCollector) -> None:
    serving = wf.serving
    if serving is None:
        return
    groups = groups_of(wf)
    if not groups:
        out.add(MetadataError, "serving declares no state groups",
                path=f"{SV}.state_service.groups", expected="a non-empty map")
    elif serving.accepted_len is None:
        out.add(MetadataError, "serving with state groups needs accepted_len",
                path=f"{SV}.accepted_len", expected="the name of a workflow input")
    for control, dtypes in CONTROL_DTYPES.items():
        value = getattr(serving, control)
        if value is None:
            continue
        path = f"{SV}.{control}"
        if value not in values:
            out.add(MetadataError, f"serving control '{value}' is not a defined value",
                    path=path, value=value, expected="a workflow input")
            continue
        contract = values[value]
        if contract is None:
            continue
        layout = contract.batch_layout
        if contract.dtype not in dtypes:
            out.add(MetadataError, f"serving control '{value}' has dtype {contract.dtype}",
                    path=path, value=contract.dtype, expected=" or ".join(dtypes[:2]) +
                    (" (an integer dtype)" if len(dtypes) > 2 else ""))
        elif contract.rank > 1:
            out.add(MetadataError, f"serving control '{value}' has rank {contract.rank}",
                    path=path, value=contract.rank, expected="rank 0 or 1")
        elif contract.rank == 1 and not (layout.kind == "request_aligned" and layout.axis == 0):
            out.add(MetadataError, f"rank-1 serving control '{value}' is not request_aligned "
                    "on axis 0", path=path, value=layout.kind,
                    expected="batch_layout {kind: request_aligned, axis: 0}")
    for name, group in groups.items():
        _check_group(wf, name, group, groups, out)


def _check_group(wf: Workflow, name: str, group, groups: dict, out: ProblemCollector) -> None:
    path = f"{SV}.state_service.groups.{name}"
    if not group.layout.strip():
        out.add(MetadataError, "a state group needs a non-empty layout", path=f"{path}.layout",
                value=group.layout, expected="a label such as bnsh")
    update = group.update.kind if group.update else "append"
    if group.update is not None:
        extra = group.update.model_extra or {}
        for key in sorted(set(extra) - UPDATE_KEYS[update]):
            out.add(MetadataError, f"unknown key '{key}'", path=f"{path}.update.{key}",
                    value=extra[key], expected=f"the keys of an {update} update")
    if update == "append" and group.sequence_axis is None:
        out.add(MetadataError, "an append group needs a sequence_axis",
                path=f"{path}.sequence_axis", expected="the axis caches grow on")
    if group.capabilities.rollback_positions == 0:
        out.add(MetadataError, "rollback_positions 0 is not allowed (omit it when the group "
                "cannot roll back)", path=f"{path}.capabilities.rollback_positions", value=0,
                expected="an integer >= 1, or no key")
    for index, other in enumerate(group.capabilities.cascade):
        if other not in groups:
            out.add(MetadataError, f"cascade names an unknown group '{other}'",
                    path=f"{path}.capabilities.cascade.{index}", value=other,
                    expected="one of " + ", ".join(groups))
    if group.sequence_axis is not None:
        for cell_name, cell in wf.state.items():
            if cell.service_group == name and group.sequence_axis >= cell.contract.rank:
                out.add(MetadataError, f"sequence_axis {group.sequence_axis} is not below the "
                        f"rank {cell.contract.rank} of cell '{cell_name}'",
                        path=f"{path}.sequence_axis", value=group.sequence_axis,
                        expected=f"an axis < {cell.contract.rank}")
    for component, aliases in group.ports.items():
        _check_aliases(wf, name, group, component, aliases, out)
    _check_borrowed(wf, name, group, out)


def _check_aliases(wf: Workflow, group_name: str, group, component: str, aliases: dict,
                   out: ProblemCollector) -> None:
    path = f"{SV}.state_service.groups.{group_name}.ports.{component}"
    if component not in wf.components:
        out.add(MetadataError, f"aliases for an undeclared component '{component}'", path=path,
                value=component, expected="one of " + ", ".join(wf.components))
        return
    inputs, outputs = ports_of(wf.components[component])
    check_ports = declares_ports(wf.components[component])
    for cell_name, alias in aliases.items():
        where = f"{path}.{cell_name}"
        cell = wf.state.get(cell_name)
        if cell is None:
            out.add(MetadataError, f"alias names an unknown state cell '{cell_name}'",
                    path=where, value=cell_name, expected="one of " + ", ".join(wf.state))
        elif cell.service_group is not None and cell.service_group != group_name:
            out.add(MetadataError, f"alias names cell '{cell_name}' of group "
                    f"'{cell.service_group}' inside group '{group_name}'", path=where,
                    value=cell_name, expected=f"a cell whose service_group is '{group_name}'")
        if check_ports and alias.input not in inputs:
            out.add(MetadataError, f"alias input '{alias.input}' is not a declared input port "
                    f"of '{component}'", path=f"{where}.input", value=alias.input,
                    expected="one of " + ", ".join(inputs))
        if check_ports and alias.output is not None and alias.output not in outputs:
            out.add(MetadataError, f"alias output '{alias.output}' is not a declared output "
                    f"port of '{component}'", path=f"{where}.output", value=alias.output,
                    expected="one of " + ", ".join(outputs))
        if alias.access == "read_write" and alias.output is None:
            out.add(MetadataError, "a read_write alias needs an output", path=f"{where}.output",
                    expected="the port that hands out the cell's next value")
        if alias.access == "read_only" and alias.output is not None:
            out.add(MetadataError, "a read_only alias has no output", path=f"{where}.output",
                    value=alias.output, expected="no output (or access: read_write)")
    # rule 23: layers
    by_role: dict[str, list[tuple[str, object]]] = {}
    for cell_name, alias in aliases.items():
        if alias.role is not None:
            by_role.setdefault(alias.role, []).append((cell_name, alias))
    for role, items in by_role.items():
        claimed: dict[int, str] = {}
        for cell_name, alias in items:
            layer = alias.layer  # type: ignore[attr-defined]
            if len(items) > 1 and layer is None:
                out.add(MetadataError, f"'{component}' has {len(items)} {role} aliases in group "
                        f"'{group_name}', so each needs a layer", path=f"{path}.{cell_name}.layer",
                        expected="a layer index")
            if layer is not None and layer in claimed:
                out.add(MetadataError, f"layer {layer} of role {role} is claimed by both "
                        f"'{claimed[layer]}' and '{cell_name}'",
                        path=f"{path}.{cell_name}.layer", value=layer,
                        expected="a layer not used by another alias of this role")
            elif layer is not None:
                claimed[layer] = cell_name
    if group.kind in ATTENTION_KINDS and ("key" in by_role or "value" in by_role):
        keys = sorted({a.layer or 0 for _, a in by_role.get("key", [])})  # type: ignore
        values = sorted({a.layer or 0 for _, a in by_role.get("value", [])})  # type: ignore
        if keys != values:
            out.add(MetadataError, f"key layers {keys} differ from value layers {values} for "
                    f"'{component}' in attention group '{group_name}'", path=path,
                    value={"key": keys, "value": values}, expected="the same layers")


def owners(wf: Workflow) -> dict[str, list[tuple[str, object]]]:
    """Cell -> every (component, alias) that writes it (read_write with an output)."""
    result: dict[str, list[tuple[str, object]]] = {}
    for group in groups_of(wf).values():
        for component, aliases in group.ports.items():
            for cell_name, alias in aliases.items():
                if alias.access == "read_write" and alias.output is not None:
                    result.setdefault(cell_name, []).append((component, alias))
    return result


def _check_borrowed(wf: Workflow, group_name: str, group, out: ProblemCollector) -> None:
    """Rule 24 (M part): a borrowed cache port must fit the owner's output port."""
    writers = owners(wf)
    for component, aliases in group.ports.items():
        inputs, _ = ports_of(wf.components.get(component))
        for cell_name, alias in aliases.items():
            if alias.access != "read_only" or len(writers.get(cell_name, [])) != 1:
                continue
            owner, owner_alias = writers[cell_name][0]
            _, owner_outputs = ports_of(wf.components.get(owner))
            have = owner_outputs.get(owner_alias.output)  # type: ignore[attr-defined]
            want = inputs.get(alias.input)
            if have is None or want is None:
                continue
            reason = incompatibility(have, want)
            if reason:
                out.add(MetadataError, f"borrowed cache port '{alias.input}' of '{component}' "
                        f"({describe(want)}) does not fit the owner's output "
                        f"'{owner}.{owner_alias.output}' ({describe(have)}): "  # type: ignore
                        f"{reason}", path=f"{SV}.state_service.groups.{group_name}.ports."
                        f"{component}.{cell_name}.input", value=alias.input,
                        expected=describe(have))


# -- speculative (rules 26, 28–34) --------------------------------------------------------
def _check_speculative(doc: Document, out: ProblemCollector) -> None:
    spec = doc.speculative
    if spec is None:
        return
    wf = doc.workflow
    for key in ("proposer", "target"):
        name = getattr(spec, key)
        if name not in wf.components:
            out.add(MetadataError, f"speculative {key} '{name}' is not a declared component",
                    path=f"speculative.{key}", value=name,
                    expected="one of " + ", ".join(wf.components))
    if spec.proposer == spec.target:
        out.add(MetadataError, "speculative proposer and target are the same component",
                path="speculative.proposer", value=spec.proposer,
                expected="two distinct components")
    groups = groups_of(wf)
    for index, group in enumerate(spec.shared_state):  # rule 34
        if group not in groups:
            out.add(MetadataError, f"shared_state names an unknown group '{group}'",
                    path=f"speculative.shared_state.{index}", value=group,
                    expected="one of " + ", ".join(groups))
    _check_rollback_state(doc, out)
    if spec.proposer in wf.components and spec.target in wf.components \
            and spec.proposer != spec.target and spec.proposal_execution.kind == "chained":
        _check_chain(doc, out)


def _check_rollback_state(doc: Document, out: ProblemCollector) -> None:
    """Rule 33 (M part)."""
    spec = doc.speculative
    assert spec is not None
    wf = doc.workflow
    groups = groups_of(wf)
    reached: dict[str, str] = {}  # group -> path that reached it
    pending: list[tuple[str, str]] = []
    for index, cell_name in enumerate(spec.rollback_state):
        path = f"speculative.rollback_state.{index}"
        cell = wf.state.get(cell_name)
        if cell is None:
            out.add(MetadataError, f"rollback_state names an unknown cell '{cell_name}'",
                    path=path, value=cell_name, expected="one of " + ", ".join(wf.state))
        elif cell.service_group is not None:
            pending.append((cell.service_group, f"{WF}.state.{cell_name}.service_group"))
    while pending:
        group_name, via = pending.pop()
        if group_name in reached:
            continue
        reached[group_name] = via
        group = groups.get(group_name)
        if group is None:
            out.add(MetadataError, f"group '{group_name}', reached from rollback_state, is not "
                    "declared", path=via, value=group_name, expected="a declared state group")
            continue
        path = f"{SV}.state_service.groups.{group_name}.capabilities"
        bound = group.capabilities.rollback_positions
        if bound is None:
            out.add(MetadataError, f"group '{group_name}' (reached from rollback_state) declares "
                    "no rollback_positions", path=f"{path}.rollback_positions",
                    expected=f">= max_proposal_width ({spec.max_proposal_width})")
        elif bound < spec.max_proposal_width:
            out.add(MetadataError, f"group '{group_name}' rolls back {bound} positions, fewer "
                    f"than max_proposal_width {spec.max_proposal_width}",
                    path=f"{path}.rollback_positions", value=bound,
                    expected=f">= {spec.max_proposal_width}")
        for index, other in enumerate(group.capabilities.cascade):
            pending.append((other, f"{path}.cascade.{index}"))


def _check_chain(doc: Document, out: ProblemCollector) -> None:
    """Rules 28–31 and the κ agreement of §5."""
    spec = doc.speculative
    assert spec is not None
    wf = doc.workflow
    pe = spec.proposal_execution
    path = "speculative.proposal_execution"
    p_inputs, p_outputs = ports_of(wf.components[spec.proposer])
    _, t_outputs = ports_of(wf.components[spec.target])
    for key, ports, side in (("token_embedding_input", p_inputs, "input"),
                             ("logits_output", p_outputs, "output"),
                             ("folded_carry_output", p_outputs, "output")):
        port = getattr(pe, key)
        if port is None:
            if key != "folded_carry_output":  # its absence is unsupported (support, rule 27)
                out.add(MetadataError, f"a chained proposal needs {key}", path=f"{path}.{key}",
                        expected=f"a proposer {side} port")
        elif port not in ports:
            out.add(MetadataError, f"{key} '{port}' is not a declared {side} port of proposer "
                    f"'{spec.proposer}'", path=f"{path}.{key}", value=port,
                    expected="one of " + ", ".join(ports))  # rule 28
    if pe.folded_carry_output is None:
        return
    # rule 29
    hidden = spec.port_bindings.get("target_hidden_context")
    for key, present in (("folded_carry_seed", pe.folded_carry_seed is not None),
                         ("token_embedding", pe.token_embedding is not None)):
        if not present:
            out.add(MetadataError, f"a folded carry needs {key}", path=f"{path}.{key}",
                    expected="{component: <target>, ...}")
    if hidden is None:
        out.add(MetadataError, "a folded carry needs port_bindings.target_hidden_context",
                path="speculative.port_bindings.target_hidden_context",
                expected=f"'{pe.token_embedding_input}' (the token_embedding_input)")
    elif hidden != pe.token_embedding_input:
        out.add(MetadataError, "port_bindings.target_hidden_context must equal "
                "token_embedding_input: the carry comes back as the tail of the fused input",
                path="speculative.port_bindings.target_hidden_context", value=hidden,
                expected=str(pe.token_embedding_input))
    if wf.components[spec.target].implementation.kind != "onnx":
        out.add(MetadataError, "a folded carry needs an ONNX target",
                path=f"{WF}.components.{spec.target}.implementation.kind",
                value=wf.components[spec.target].implementation.kind, expected="onnx")
    seed_contract = None
    if pe.folded_carry_seed is not None:
        seed = pe.folded_carry_seed
        if seed.component != spec.target:
            out.add(MetadataError, "folded_carry_seed.component must be the target",
                    path=f"{path}.folded_carry_seed.component", value=seed.component,
                    expected=spec.target)
        if seed.output not in t_outputs:
            out.add(MetadataError, f"folded_carry_seed.output '{seed.output}' is not a declared "
                    f"output of target '{spec.target}'", path=f"{path}.folded_carry_seed.output",
                    value=seed.output, expected="one of " + ", ".join(t_outputs))
        seed_contract = t_outputs.get(seed.output)
    if pe.token_embedding is not None:
        emb = pe.token_embedding
        if emb.component != spec.target:
            out.add(MetadataError, "token_embedding.component must be the target",
                    path=f"{path}.token_embedding.component", value=emb.component,
                    expected=spec.target)
        if not emb.table:
            out.add(MetadataError, "token_embedding.table is empty",
                    path=f"{path}.token_embedding.table", value=emb.table,
                    expected="the name of an initializer of the target model")
        if emb.scale is not None and (not math.isfinite(emb.scale) or emb.scale <= 0):
            out.add(MetadataError, f"token_embedding.scale {emb.scale} is not a finite number "
                    "> 0", path=f"{path}.token_embedding.scale", value=emb.scale,
                    expected="a finite number > 0")
    fused = p_inputs.get(pe.token_embedding_input or "")
    carry = p_outputs.get(pe.folded_carry_output)
    if fused is None:
        return
    # rule 30: currency
    for key, contract in (("folded_carry_seed.output", seed_contract),
                          ("folded_carry_output", carry)):
        if contract is not None and contract.dtype != fused.dtype:
            out.add(MetadataError, f"{key} has dtype {contract.dtype} but the fused port "
                    f"'{pe.token_embedding_input}' (the chain's currency) is {fused.dtype}",
                    path=f"{path}.{key}", value=contract.dtype, expected=fused.dtype)
    # rule 31: widths
    w_f, w_seed, w_carry = last_extent(fused), last_extent(seed_contract), last_extent(carry)
    if w_seed is not None and w_carry is not None and w_seed != w_carry:
        out.add(MetadataError, f"carry widths disagree: folded_carry_seed output is {w_seed}, "
                f"folded_carry_output is {w_carry}", path=f"{path}.folded_carry_output",
                value=w_carry, expected=str(w_seed))
    w_c = w_seed if w_seed is not None else w_carry
    if w_c is not None and w_f is not None and w_c >= w_f:
        out.add(MetadataError, f"carry width W_C {w_c} leaves no room for the embedding in the "
                f"fused width W_F {w_f}", path=f"{path}.token_embedding_input",
                value={"W_C": w_c, "W_F": w_f}, expected="W_C < W_F")
    # §5: the borrowed-cache ports agree on their sequence-axis symbol (κ)
    kappas = borrowed_symbols(doc)
    if len(set(kappas.values())) > 1:
        out.add(MetadataError, "borrowed cache ports disagree on the symbol of their sequence "
                f"axis: {kappas}", path=f"{SV}.state_service.groups", value=kappas,
                expected="one symbol (the borrowed-cache symbol)")


def position_symbol(doc: Document) -> str | None:
    """σ: the symbol on the fused port's second-to-last axis (rank >= 3), if any."""
    spec = doc.speculative
    if spec is None or spec.proposal_execution.token_embedding_input is None:
        return None
    inputs, _ = ports_of(doc.workflow.components.get(spec.proposer))
    fused = inputs.get(spec.proposal_execution.token_embedding_input)
    if fused is None or fused.rank < 3:
        return None
    dim = fused.dims[-2]
    return dim if isinstance(dim, str) else None


def borrowed_symbols(doc: Document) -> dict[str, str]:
    """Proposer borrowed-cache port -> the symbol on its group's sequence_axis."""
    spec = doc.speculative
    if spec is None:
        return {}
    wf = doc.workflow
    inputs, _ = ports_of(wf.components.get(spec.proposer))
    result = {}
    for group in groups_of(wf).values():
        for alias in group.ports.get(spec.proposer, {}).values():
            contract = inputs.get(alias.input)
            axis = group.sequence_axis
            if alias.access != "read_only" or contract is None or axis is None \
                    or axis >= contract.rank:
                continue
            dim = contract.dims[axis]
            if isinstance(dim, str):
                result[alias.input] = dim
    return result


# -- capabilities (rule 35) ---------------------------------------------------------------
def used_capabilities(wf: Workflow) -> list[str]:
    used = ["workflow_ssa"]
    if wf.serving is not None:
        used.append("serving_service_contract")
    if any(step.kind == "emit" for step in wf.steps):
        used.append("typed_emit")
    if any(cell.recurrence.kind == "bounded" for cell in wf.state.values()):
        used.append("bounded_state_recurrence")
    return used


def _check_capabilities(wf: Workflow, out: ProblemCollector) -> None:
    listed = wf.manifest.capabilities
    path = f"{WF}.manifest.capabilities"
    duplicates = sorted({c for c in listed if listed.count(c) > 1})
    if duplicates:
        out.add(MetadataError, f"manifest.capabilities lists {duplicates} more than once",
                path=path, value=listed, expected="unique capability names")
    for capability in used_capabilities(wf):
        if capability not in listed:
            out.add(MetadataError, f"capability '{capability}' is used but not listed in "
                    "manifest.capabilities", path=path, value=listed,
                    expected=f"a list including '{capability}'")
