"""Admission against the ONNX graphs (metadata.md §7, A1–A8).

Runs only on a document that passed §6. Graphs are parsed without loading external data
(binary) or from protobuf text (``.onnx.textproto``, whose initializers must be inline); the
declared ports, invoke bindings and the chain's embedding table are then compared with them.
Every failure is an ``AdmissionError`` naming the component, the port and both sides. A9
(ONNX Runtime refusing a session) belongs to the session layer.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf import text_format
from google.protobuf.message import DecodeError

from speculant.errors import AdmissionError, ProblemCollector
from speculant.package.model import Document, TensorContract
from speculant.package.paths import confine_external_data
from speculant.package.rules import WF, last_extent, ports_of

TEXTPROTO_SUFFIX = ".onnx.textproto"
ELEMENT_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6,
                 "int64": 7, "bool": 9, "float16": 10, "uint32": 12, "uint64": 13,
                 "bfloat16": 16, "float8_e4m3fn": 17, "float8_e5m2": 19}  # float8_e4m3: none
DTYPE_OF_ELEMENT = {v: k for k, v in ELEMENT_TYPES.items()}
MAX_LISTED_INITIALIZERS = 8


def element_name(elem_type: int) -> str:
    return DTYPE_OF_ELEMENT.get(elem_type) or onnx.TensorProto.DataType.Name(elem_type).lower()


# -- A1: parsing ----------------------------------------------------------------------------
def read_graph(component: str, artifact: Path, root: Path, artifact_field: str,
               out: ProblemCollector) -> onnx.ModelProto | None:
    """Parse one component's artifact; record A1 (and external-data confinement, §2.3)."""
    file = str(artifact)
    try:
        if artifact.name.endswith(TEXTPROTO_SUFFIX):
            model = text_format.Parse(artifact.read_text(encoding="utf-8"), onnx.ModelProto())
        else:
            model = onnx.load(str(artifact), load_external_data=False)
    except (text_format.ParseError, DecodeError, UnicodeDecodeError, OSError, ValueError) as exc:
        out.add(AdmissionError, f"the artifact of component '{component}' does not parse as an "
                f"ONNX ModelProto: {exc}", path=artifact_field, file=file,
                expected="a ModelProto (binary .onnx or protobuf text .onnx.textproto)")
        return None
    if not model.HasField("graph"):
        out.add(AdmissionError, f"the artifact of component '{component}' holds no graph",
                path=artifact_field, file=file, expected="a ModelProto with a graph")
        return None
    external = external_locations(model)
    if artifact.name.endswith(TEXTPROTO_SUFFIX):
        for tensor_name, location in external:
            out.add(AdmissionError, f"text-format model of component '{component}' references "
                    f"external data: initializer '{tensor_name}' in '{location}'",
                    path=artifact_field, file=file, value=location,
                    expected="inline initializers (text-format models cannot use external data)")
        return model
    confine_external_data(root, external, artifact, artifact_field, out)
    return model


def external_locations(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(tensor name, location) of every tensor of the model stored as external data."""
    found = []
    tensors = list(model.graph.initializer)
    tensors += [s.values for s in model.graph.sparse_initializer]
    for node in model.graph.node:
        tensors += [a.t for a in node.attribute if a.HasField("t")]
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            found.append((tensor.name, entries.get("location", "")))
    return found


# -- A2–A8 --------------------------------------------------------------------------------
def _graph_ports(model: onnx.ModelProto) -> tuple[dict, dict]:
    return ({v.name: v for v in model.graph.input}, {v.name: v for v in model.graph.output})


def _graph_dims(value: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """The graph's declared shape of ``value`` (``None`` when it declares none)."""
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims: list[int | str | None] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return dims


def admit(doc: Document, graphs: dict[str, onnx.ModelProto], files: dict[str, str],
          out: ProblemCollector) -> int | None:
    """Compare the document with the parsed graphs (A2–A8); return W_E when a chained
    proposal names an embedding table that admits."""
    wf = doc.workflow
    for component, model in graphs.items():
        _check_ports(component, model, wf.components[component], files[component], out)
    for index, step in enumerate(wf.steps):
        if step.kind == "invoke" and step.component in graphs:
            _check_invoke(index, step, graphs[step.component], files[step.component], out)
    return _check_chain(doc, graphs, files, out)


def _check_ports(component: str, model: onnx.ModelProto, spec, file: str,
                 out: ProblemCollector) -> None:
    path = f"{WF}.components.{component}.ports"
    for side, values in (("input", model.graph.input), ("output", model.graph.output)):
        for position, value in enumerate(values):
            if not value.name:
                out.add(AdmissionError, f"graph {side} #{position} of component '{component}' "
                        "has an empty name", path=path, file=file,
                        expected="named graph inputs and outputs")  # A2
    graph_inputs, graph_outputs = _graph_ports(model)
    inputs, outputs = ports_of(spec)
    for side, declared, graph in (("input", inputs, graph_inputs),
                                  ("output", outputs, graph_outputs)):
        for port, contract in declared.items():
            where = f"{path}.{side}s.{port}"
            if port not in graph:
                out.add(AdmissionError, f"port '{port}' of component '{component}' is not an "
                        f"{side} of its ONNX graph", path=where, file=file, value=port,
                        expected="one of " + (", ".join(graph) or "(none)"))  # A3
                continue
            _check_port_type(component, port, contract, graph[port], where, file, out)


def _check_port_type(component: str, port: str, contract: TensorContract,
                     value: onnx.ValueInfoProto, where: str, file: str,
                     out: ProblemCollector) -> None:
    """A4: dtype, then rank and the axes fixed on both sides."""
    if not value.type.HasField("tensor_type"):
        out.add(AdmissionError, f"port '{port}' of component '{component}' is not a tensor in "
                "its ONNX graph", path=where, file=file, expected=f"a {contract.dtype} tensor")
        return
    elem_type = value.type.tensor_type.elem_type
    if ELEMENT_TYPES.get(contract.dtype) != elem_type:
        out.add(AdmissionError, f"port '{port}' of component '{component}' is {contract.dtype} "
                f"in the metadata but {element_name(elem_type)} in the ONNX graph",
                path=f"{where}.dtype", file=file, value=element_name(elem_type),
                expected=contract.dtype)
    dims = _graph_dims(value)
    if dims is None:
        return
    if len(dims) != contract.rank:
        out.add(AdmissionError, f"port '{port}' of component '{component}' has rank "
                f"{contract.rank} in the metadata but {len(dims)} in the ONNX graph "
                f"(shape {dims})", path=f"{where}.rank", file=file, value=len(dims),
                expected=str(contract.rank))
        return
    for axis, (declared, graph) in enumerate(zip(contract.dims, dims, strict=True)):
        if isinstance(declared, int) and isinstance(graph, int) and declared != graph:
            out.add(AdmissionError, f"port '{port}' of component '{component}' axis {axis} is "
                    f"{declared} in the metadata but {graph} in the ONNX graph",
                    path=f"{where}.shape.{axis}", file=file, value=graph,
                    expected=str(declared))


def _check_invoke(index: int, step, model: onnx.ModelProto, file: str,
                  out: ProblemCollector) -> None:
    """A5: bindings name graph ports; unbound graph inputs have initializer defaults."""
    path = f"{WF}.steps.{index}"
    graph_inputs, graph_outputs = _graph_ports(model)
    initializers = {t.name for t in model.graph.initializer}
    initializers |= {t.values.name for t in model.graph.sparse_initializer}
    bound_in, bound_out = step.inputs or {}, step.outputs or {}
    for side, bound, graph in (("input", bound_in, graph_inputs),
                               ("output", bound_out, graph_outputs)):
        for port in bound:
            if port not in graph:
                out.add(AdmissionError, f"invoke of '{step.component}' binds '{port}', which is "
                        f"not an {side} of its ONNX graph", path=f"{path}.{side}s.{port}",
                        file=file, value=port, expected="one of " + (", ".join(graph)
                                                                     or "(none)"))
    for name in graph_inputs:
        if name and name not in bound_in and name not in initializers:
            out.add(AdmissionError, f"invoke of '{step.component}' leaves graph input '{name}' "
                    "unbound, and it has no initializer default", path=f"{path}.inputs.{name}",
                    file=file, expected=f"a binding for '{name}'")


def _static_last(contract: TensorContract | None, value: onnx.ValueInfoProto | None) -> int | None:
    """Last extent, fixed by the contract or else by the graph."""
    width = last_extent(contract)
    if width is None and value is not None:
        dims = _graph_dims(value)
        if dims and isinstance(dims[-1], int):
            width = dims[-1]
    return width


def _check_chain(doc: Document, graphs: dict[str, onnx.ModelProto], files: dict[str, str],
                 out: ProblemCollector) -> int | None:
    """A6–A8. Returns W_E."""
    spec = doc.speculative
    if spec is None or spec.target not in graphs or spec.proposer not in graphs:
        return None
    wf = doc.workflow
    pe = spec.proposal_execution
    target_model, proposer_model = graphs[spec.target], graphs[spec.proposer]
    p_inputs, p_outputs = ports_of(wf.components[spec.proposer])
    _, t_outputs = ports_of(wf.components[spec.target])
    p_graph_in, p_graph_out = _graph_ports(proposer_model)
    _, t_graph_out = _graph_ports(target_model)
    path = "speculative.proposal_execution"

    w_e = v_e = None
    if pe.kind == "chained" and pe.token_embedding is not None:
        table_name = pe.token_embedding.table
        tables = {t.name: t for t in target_model.graph.initializer}
        table = tables.get(table_name)
        if table is None:  # A6
            names = list(tables)
            listed = ", ".join(names[:MAX_LISTED_INITIALIZERS])
            more = ", ..." if len(names) > MAX_LISTED_INITIALIZERS else ""
            out.add(AdmissionError, f"token_embedding.table '{table_name}' is not an initializer "
                    f"of component '{spec.target}' (its model has {len(names)} initializers: "
                    f"{listed}{more})", path=f"{path}.token_embedding.table",
                    file=files[spec.target], value=table_name,
                    expected="the name of an initializer of the target model")
        else:  # A7
            dims = list(table.dims)
            currency = p_inputs[pe.token_embedding_input].dtype if \
                pe.token_embedding_input in p_inputs else None
            if len(dims) != 2 or min(dims, default=0) <= 0:
                out.add(AdmissionError, f"embedding table '{table_name}' of component "
                        f"'{spec.target}' has shape {dims}", path=f"{path}.token_embedding.table",
                        file=files[spec.target], value=dims,
                        expected="rank 2 with static dims [V_E, W_E]")
            else:
                v_e, w_e = dims
            table_dtype = element_name(table.data_type)
            if currency is not None and table_dtype != currency:
                out.add(AdmissionError, f"embedding table '{table_name}' of component "
                        f"'{spec.target}' is {table_dtype} but the chain's currency (the dtype "
                        f"of fused port '{pe.token_embedding_input}') is {currency}",
                        path=f"{path}.token_embedding.table", file=files[spec.target],
                        value=table_dtype, expected=currency)
    # A8: widths
    fused_port = pe.token_embedding_input or ""
    w_f = _static_last(p_inputs.get(fused_port), p_graph_in.get(fused_port))
    seed = pe.folded_carry_seed
    w_c = None
    if seed is not None:
        w_c = _static_last(t_outputs.get(seed.output), t_graph_out.get(seed.output))
    if w_c is None and pe.folded_carry_output:
        w_c = _static_last(p_outputs.get(pe.folded_carry_output),
                           p_graph_out.get(pe.folded_carry_output))
    if w_e is not None and w_c is not None and w_f is not None and w_e + w_c != w_f:
        out.add(AdmissionError, f"widths do not add up: embedding W_E {w_e} + carry W_C {w_c} "
                f"!= fused W_F {w_f} (port '{fused_port}' of '{spec.proposer}')",
                path=f"{path}.token_embedding_input", file=files[spec.proposer],
                value={"W_E": w_e, "W_C": w_c, "W_F": w_f}, expected="W_E + W_C = W_F")
    # A8: vocabularies
    logits_port = pe.logits_output or ""
    proposer_vocab = _static_last(p_outputs.get(logits_port), p_graph_out.get(logits_port))
    target_logits = next((p for p, r in (wf.components[spec.target].ports.roles.items()
                                         if wf.components[spec.target].ports else [])
                          if r == "logits"), None)
    target_vocab = _static_last(t_outputs.get(target_logits or ""),
                                t_graph_out.get(target_logits or ""))
    vocab_path = "speculative.vocabulary"
    vocabulary = spec.vocabulary
    if vocabulary.kind == "identical" and proposer_vocab is not None \
            and target_vocab is not None and proposer_vocab != target_vocab:
        out.add(AdmissionError, f"vocabulary is identical but proposer '{spec.proposer}' logits "
                f"'{logits_port}' are {proposer_vocab} wide and target '{spec.target}' logits "
                f"'{target_logits}' are {target_vocab} wide", path=f"{vocab_path}.kind",
                file=files[spec.proposer], value=proposer_vocab, expected=str(target_vocab))
    if vocabulary.kind == "subset" and proposer_vocab is not None:
        if proposer_vocab != vocabulary.proposer_vocab_size:
            out.add(AdmissionError, f"proposer '{spec.proposer}' logits '{logits_port}' are "
                    f"{proposer_vocab} wide but proposer_vocab_size is "
                    f"{vocabulary.proposer_vocab_size}",
                    path=f"{vocab_path}.proposer_vocab_size", file=files[spec.proposer],
                    value=proposer_vocab, expected=str(vocabulary.proposer_vocab_size))
        if target_vocab is not None and proposer_vocab > target_vocab:
            out.add(AdmissionError, f"proposer vocabulary {proposer_vocab} exceeds the target's "
                    f"{target_vocab}", path=f"{vocab_path}.proposer_vocab_size",
                    file=files[spec.proposer], value=proposer_vocab,
                    expected=f"<= {target_vocab}")
    if v_e is not None and proposer_vocab is not None and v_e < proposer_vocab:
        out.add(AdmissionError, f"embedding table has {v_e} rows, fewer than the proposer "
                f"vocabulary {proposer_vocab}", path=f"{path}.token_embedding.table",
                file=files[spec.target], value=v_e, expected=f">= {proposer_vocab}")
    return w_e
