"""The component graphs (docs/design/spec/metadata.md §2.2, admission A1): parsed without external
data, and the facts admission reads from them (ports, declared shapes, static extents).

Binary models are parsed without loading external data (whose locations are confined to the
package); text-format models (``.onnx.textproto``) must hold their initializers inline.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf import text_format
from google.protobuf.message import DecodeError

from speculant.dtypes import dtype_of_onnx
from speculant.errors import AdmissionError, ProblemCollector
from speculant.package.common import last_extent
from speculant.package.model import TensorContract
from speculant.package.paths import confine_external_data

TEXTPROTO_SUFFIX = ".onnx.textproto"


def onnx_dtype_name(elem_type: int) -> str:
    """The metadata name of an ONNX element type, else ONNX's own (lower case)."""
    return dtype_of_onnx(elem_type) or onnx.TensorProto.DataType.Name(elem_type).lower()


def read_graph(component: str, artifact: Path, root: Path, artifact_field: str,
               out: ProblemCollector) -> onnx.ModelProto | None:
    """Parse one component's artifact; record A1 (and external-data confinement)."""
    file = str(artifact)
    try:
        if artifact.name.endswith(TEXTPROTO_SUFFIX):
            model = text_format.Parse(artifact.read_text(encoding="utf-8"), onnx.ModelProto())
        else:
            model = onnx.load(str(artifact), load_external_data=False)
    except (text_format.ParseError, DecodeError, UnicodeDecodeError, OSError, ValueError) as exc:
        out.add(AdmissionError, f"the artifact of component '{component}' does not parse as an "
                f"ONNX ModelProto: {exc}", path=artifact_field, file=file, rule="A1",
                expected="a ModelProto (binary .onnx or protobuf text .onnx.textproto)")
        return None
    if not model.HasField("graph"):
        out.add(AdmissionError, f"the artifact of component '{component}' holds no graph",
                path=artifact_field, file=file, expected="a ModelProto with a graph", rule="A1")
        return None
    external = external_locations(model)
    if artifact.name.endswith(TEXTPROTO_SUFFIX):
        for tensor_name, location in external:
            out.add(AdmissionError, f"text-format model of component '{component}' references "
                    f"external data: initializer '{tensor_name}' in '{location}'",
                    path=artifact_field, file=file, value=location, rule="A1",
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


def graph_ports(model: onnx.ModelProto) -> tuple[dict[str, onnx.ValueInfoProto],
                                                  dict[str, onnx.ValueInfoProto]]:
    return ({v.name: v for v in model.graph.input}, {v.name: v for v in model.graph.output})


def graph_dims(value: onnx.ValueInfoProto) -> list[int | str | None] | None:
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


def static_last(contract: TensorContract | None,
                value: onnx.ValueInfoProto | None) -> int | None:
    """Last extent, fixed by the contract or else by the graph."""
    width = last_extent(contract)
    if width is None and value is not None:
        dims = graph_dims(value)
        if dims and isinstance(dims[-1], int):
            width = dims[-1]
    return width
