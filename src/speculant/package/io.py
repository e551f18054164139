"""Inputs, outputs, components and their ports (docs/design/spec/metadata.md §4.1–4.6): rules 7–11,
the contracts speculant can bind, the target's driver roles, and admission of the declared ports
against the graphs (A2–A4). Derives the target's port roles.

The driver binds the target's token ids and reads its logits through the ports whose roles
say so: a target without a ``token_ids`` input or a ``logits`` output cannot be driven, and
load says which role is missing.
"""

from __future__ import annotations

import math

import onnx

from speculant.dtypes import DTYPES, FLOAT8_DTYPES
from speculant.errors import AdmissionError, MetadataError, ProblemCollector, shown
from speculant.package.common import (
    INTEGER_DTYPES,
    WF,
    check_path,
    component_roles,
    declares_ports,
    describe,
    invokes_of,
    is_empty,
    ports_of,
    unsupported,
)
from speculant.package.graphs import graph_dims, graph_ports, onnx_dtype_name
from speculant.package.model import Document, TensorContract, Workflow

RUNTIME_ROLES = ("prompt_tokens", "max_output_tokens", "max_iterations", "seed",
                 "sampling_temperature", "sampling_top_k", "sampling_top_p", "sampling_min_p")
UNSUPPORTED_LAYOUTS = ("request_expanded", "token_packed", "runtime_sequence_state")
ARTIFACT_SUFFIXES = (".onnx", ".onnx.textproto")
IMPLEMENTATION_KEYS = {"onnx": set(), "adapter": {"abi", "version"}, "binding": set()}
DRIVER_ROLES = (("token_ids", "inputs"), ("logits", "outputs"))  # what the driver needs


def check(doc: Document, out: ProblemCollector) -> None:
    wf = doc.workflow
    _check_inputs(wf, out)
    _check_outputs(wf, out)
    _check_components(doc, out)
    _check_contracts(doc, out)
    _check_driver_roles(doc, out)


# -- workflow inputs and outputs (rules 7, 8) -----------------------------------------------
def _check_inputs(wf: Workflow, out: ProblemCollector) -> None:
    for name, spec in wf.inputs.items():
        path = f"{WF}.inputs.{name}"
        role = spec.role
        if role.kind == "semantic":
            out.add(MetadataError, "an input role is {kind: runtime, version, role} or "
                    "{kind: opaque}", path=f"{path}.role.kind", value=role.kind,
                    expected="runtime or opaque", rule="7")
        if role.kind == "runtime":
            for key in ("version", "role"):
                if getattr(role, key) is None:
                    out.add(MetadataError, f"a runtime role needs '{key}'",
                            path=f"{path}.role.{key}", expected=f"a value for '{key}'", rule="7")
        elif spec.source.kind == "request":
            out.add(MetadataError, "an input with a request source needs a runtime role",
                    path=f"{path}.role", value=role.kind,
                    expected="{kind: runtime, version, role}", rule="7")
        if not spec.required and spec.default is None and spec.present_as is None:
            out.add(MetadataError, "an input with required: false needs a default (or a "
                    "present_as)", path=f"{path}.default", expected="a literal default",
                    rule="7")
        if spec.default is not None:
            reason = default_problem(spec.contract, spec.default)
            if reason:
                out.add(MetadataError, f"bad literal default: {reason}", path=f"{path}.default",
                        value=spec.default, rule="8",
                        expected=f"a scalar or row-major list for {describe(spec.contract)}")
        if spec.source.kind == "request" and role.kind == "runtime" and role.role is not None \
                and role.role not in RUNTIME_ROLES:
            unsupported(out, "2", f"runtime role '{role.role}' on a request input",
                        f"{path}.role.role", role.role, "one of " + ", ".join(RUNTIME_ROLES))
        if spec.source.kind == "artifact":
            unsupported(out, "2", "an artifact input source", f"{path}.source",
                        spec.source.path, "request, application or literal")
        if spec.present_as is not None:
            unsupported(out, "2", "present_as", f"{path}.present_as", spec.present_as, "absent")


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


def _check_outputs(wf: Workflow, out: ProblemCollector) -> None:
    for name, output in wf.outputs.items():
        path = f"{WF}.outputs.{name}"
        if output.role not in ("tensor", "tokens"):
            unsupported(out, "2", f"output role '{output.role}'", f"{path}.role", output.role,
                        "tensor or tokens")
        for key in ("value_range", "media"):
            if getattr(output, key) is not None:
                unsupported(out, "2", f"output {key}", f"{path}.{key}", None, "absent")
        if output.family is not None and output.family.kind != "materialized":
            unsupported(out, "2", f"output family '{output.family.kind}'",
                        f"{path}.family.kind", output.family.kind, "materialized or absent")
        elif output.family is not None and output.family.model_extra:
            unsupported(out, "2", "keys of a materialized output family",
                        f"{path}.family.{sorted(output.family.model_extra)[0]}", None,
                        "only 'kind'")


# -- components (rules 4, 9, 10, 11) --------------------------------------------------------
def _check_components(doc: Document, out: ProblemCollector) -> None:
    wf = doc.workflow
    target, proposer = component_roles(doc)
    for name, component in wf.components.items():
        path = f"{WF}.components.{name}"
        if not name or "." in name:
            out.add(MetadataError, "a component name is non-empty and contains no '.'",
                    path=path, value=name, expected="a name without '.'", rule="9")
        impl = component.implementation
        for key in sorted(set(impl.model_extra or {}) - IMPLEMENTATION_KEYS[impl.kind]):
            out.add(MetadataError, f"unknown key '{key}'", path=f"{path}.implementation.{key}",
                    value=(impl.model_extra or {})[key], rule="2",
                    expected=f"the keys of a {impl.kind} implementation")
        if impl.kind == "onnx":
            _check_artifact(impl.artifact, f"{path}.implementation.artifact", out)
        inputs, outputs = ports_of(component)
        if component.ports is not None and declares_ports(component):
            for port in component.ports.roles:
                if port not in inputs and port not in outputs:
                    out.add(MetadataError, f"role names '{port}', which is not a declared port "
                            f"of '{name}'", path=f"{path}.ports.roles.{port}", value=port,
                            expected="a key of ports.inputs or ports.outputs", rule="10")
        if component.contract is not None:
            for role, port in component.contract.bindings.items():
                if port not in inputs and port not in outputs:
                    out.add(MetadataError, f"contract binding '{role}' names '{port}', which is "
                            f"not a declared port of '{name}'", rule="10",
                            path=f"{path}.contract.bindings.{role}", value=port,
                            expected="a key of ports.inputs or ports.outputs")
        # rule 11 and the component keys speculant does not execute
        if name not in (target, proposer):
            what = "a component other than the speculative target and proposer" if \
                doc.speculative else "a workflow of more than one component without a " \
                "speculative section"
            unsupported(out, "11", f"{what} ('{name}')", path, name,
                        "exactly the target (and the speculative proposer)")
        if impl.kind != "onnx":
            unsupported(out, "2", f"a {impl.kind} implementation", f"{path}.implementation.kind",
                        impl.kind, "onnx")
        if not declares_ports(component):
            unsupported(out, "11", "inferred ports (no declared inputs or outputs)",
                        f"{path}.ports", None, "declared ports.inputs and ports.outputs")
        if component.application_overridable:
            unsupported(out, "2", "application_overridable: true",
                        f"{path}.application_overridable", True, "false or absent")
        for key in ("effects", "cache_affects_state", "row_scope"):
            if not is_empty(getattr(component, key)):
                unsupported(out, "2", f"component {key}", f"{path}.{key}",
                            getattr(component, key), "absent or empty")


def _check_artifact(artifact: str | None, path: str, out: ProblemCollector) -> None:
    if not artifact:
        out.add(MetadataError, "an onnx implementation needs a non-empty artifact", path=path,
                value=artifact, rule="9",
                expected="a relative path ending in .onnx or .onnx.textproto")
        return
    if not check_path(artifact, path, out):
        return
    if not artifact.endswith(ARTIFACT_SUFFIXES):
        out.add(MetadataError, f"artifact '{artifact}' is neither .onnx nor .onnx.textproto",
                path=path, value=artifact, rule="4",
                expected="a name ending in .onnx or .onnx.textproto")


# -- contracts speculant binds --------------------------------------------------------------
def _all_contracts(doc: Document) -> list[tuple[str, TensorContract]]:
    wf = doc.workflow
    found = [(f"{WF}.inputs.{n}.contract", i.contract) for n, i in wf.inputs.items()]
    found += [(f"{WF}.outputs.{n}.contract", o.contract) for n, o in wf.outputs.items()]
    found += [(f"{WF}.state.{n}.contract", c.contract) for n, c in wf.state.items()]
    for name, component in wf.components.items():
        inputs, outputs = ports_of(component)
        found += [(f"{WF}.components.{name}.ports.inputs.{p}", c) for p, c in inputs.items()]
        found += [(f"{WF}.components.{name}.ports.outputs.{p}", c) for p, c in outputs.items()]
    return found


def _bound_contracts(doc: Document) -> list[tuple[str, TensorContract]]:
    """Contracts of the ports and values speculant binds or reads."""
    wf = doc.workflow
    found = []
    for step in wf.steps:
        if step.kind == "invoke" and step.component in wf.components:
            inputs, outputs = ports_of(wf.components[step.component])
            path = f"{WF}.components.{step.component}.ports"
            found += [(f"{path}.inputs.{p}", inputs[p]) for p in step.inputs or {}
                      if p in inputs]
            found += [(f"{path}.outputs.{p}", outputs[p]) for p in step.outputs or {}
                      if p in outputs]
            found += [(f"{WF}.inputs.{v}.contract", wf.inputs[v].contract)
                      for v in (step.inputs or {}).values() if v in wf.inputs]
        if step.kind == "emit" and step.output in wf.outputs:
            found.append((f"{WF}.outputs.{step.output}.contract",
                          wf.outputs[step.output].contract))
    found += [(f"{WF}.state.{n}.contract", c.contract) for n, c in wf.state.items()]
    return list(dict(found).items())


def _check_contracts(doc: Document, out: ProblemCollector) -> None:
    for path, contract in _all_contracts(doc):
        if contract.batch_layout.kind in UNSUPPORTED_LAYOUTS:
            unsupported(out, "2", f"batch_layout '{contract.batch_layout.kind}'",
                        f"{path}.batch_layout.kind", contract.batch_layout.kind,
                        "shared or request_aligned")
        if contract.padding:  # valid lengths speculant would not honour
            unsupported(out, "2", f"a padded axis '{contract.padding[0].dimension}'",
                        f"{path}.padding", None, "no padding")
    for path, contract in _bound_contracts(doc):
        if contract.dtype in FLOAT8_DTYPES:
            unsupported(out, "2", f"a {contract.dtype} value that speculant binds or reads",
                        f"{path}.dtype", contract.dtype, "a non-float8 dtype")


# -- the target's driver roles --------------------------------------------------------------
def _check_driver_roles(doc: Document, out: ProblemCollector) -> None:
    """The driver binds ``token_ids`` and reads ``logits`` through the target's role ports,
    which its invoke must bind."""
    wf = doc.workflow
    target, _ = component_roles(doc)
    component = wf.components.get(target or "")
    if component is None or not declares_ports(component):
        return  # no target to drive (reported elsewhere)
    by_role = {role: port for port, role in port_roles(doc, target).items()}
    invokes = invokes_of(wf, target)
    path = f"{WF}.components.{target}.ports"
    for role, side in DRIVER_ROLES:
        port = by_role.get(role)
        declared = getattr(component.ports, side)
        if port is None or port not in declared:
            unsupported(out, "4.6", f"a target without an {side[:-1]} port of role '{role}'",
                        f"{path}.roles", None, f"ports.roles naming the target's '{role}' "
                        f"{side[:-1]} port (speculant binds the token ids and reads the logits "
                        "through these roles)")
            continue
        if len(invokes) == 1:
            index, step = invokes[0]
            if port not in (getattr(step, side) or {}):
                unsupported(out, "4.6", f"a target invoke that leaves its '{role}' port "
                            f"'{port}' unbound", f"{WF}.steps.{index}.{side}.{port}", None,
                            f"a binding for '{port}'")


def port_roles(doc: Document, component: str | None) -> dict[str, str]:
    """Port -> role of ``component`` (empty when it declares none)."""
    found = doc.workflow.components.get(component or "")
    return dict(found.ports.roles) if found is not None and found.ports is not None else {}


# -- admission: A2–A4 -----------------------------------------------------------------------
def admit(doc: Document, graphs: dict[str, onnx.ModelProto], files: dict[str, str],
          out: ProblemCollector) -> None:
    """A2 (named graph ports), A3 (every declared port is a graph port), A4 (its type)."""
    for component, model in graphs.items():
        _admit_ports(component, model, doc.workflow.components[component], files[component],
                     out)


def _admit_ports(component: str, model: onnx.ModelProto, spec, file: str,
                 out: ProblemCollector) -> None:
    path = f"{WF}.components.{component}.ports"
    for side, values in (("input", model.graph.input), ("output", model.graph.output)):
        for position, value in enumerate(values):
            if not value.name:
                out.add(AdmissionError, f"graph {side} #{position} of component '{component}' "
                        "has an empty name", path=path, file=file, rule="A2",
                        expected="named graph inputs and outputs")
    graph_inputs, graph_outputs = graph_ports(model)
    inputs, outputs = ports_of(spec)
    for side, declared, graph in (("input", inputs, graph_inputs),
                                  ("output", outputs, graph_outputs)):
        for port, contract in declared.items():
            where = f"{path}.{side}s.{port}"
            if port not in graph:
                out.add(AdmissionError, f"port '{port}' of component '{component}' is not an "
                        f"{side} of its ONNX graph", path=where, file=file, value=port,
                        expected="one of " + (", ".join(graph) or "(none)"), rule="A3")
                continue
            _admit_port_type(component, port, contract, graph[port], where, file, out)


def _admit_port_type(component: str, port: str, contract: TensorContract,
                     value: onnx.ValueInfoProto, where: str, file: str,
                     out: ProblemCollector) -> None:
    """A4: dtype, then rank and the axes fixed on both sides."""
    if not value.type.HasField("tensor_type"):
        out.add(AdmissionError, f"port '{port}' of component '{component}' is not a tensor in "
                "its ONNX graph", path=where, file=file, expected=f"a {contract.dtype} tensor",
                rule="A4")
        return
    elem_type = value.type.tensor_type.elem_type
    if DTYPES[contract.dtype].onnx != elem_type:
        out.add(AdmissionError, f"port '{port}' of component '{component}' is {contract.dtype} "
                f"in the metadata but {onnx_dtype_name(elem_type)} in the ONNX graph",
                path=f"{where}.dtype", file=file, value=onnx_dtype_name(elem_type),
                expected=contract.dtype, rule="A4")
    dims = graph_dims(value)
    if dims is None:
        return
    if len(dims) != contract.rank:
        out.add(AdmissionError, f"port '{port}' of component '{component}' has rank "
                f"{contract.rank} in the metadata but {len(dims)} in the ONNX graph "
                f"(shape {dims})", path=f"{where}.rank", file=file, value=len(dims),
                expected=str(contract.rank), rule="A4")
        return
    for axis, (declared, graph) in enumerate(zip(contract.dims, dims, strict=True)):
        if isinstance(declared, int) and isinstance(graph, int) and declared != graph:
            out.add(AdmissionError, f"port '{port}' of component '{component}' axis {axis} is "
                    f"{declared} in the metadata but {graph} in the ONNX graph",
                    path=f"{where}.shape.{axis}", file=file, value=graph,
                    expected=str(declared), rule="A4")
