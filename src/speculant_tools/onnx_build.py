"""A small helper for writing ONNX graphs by hand: named nodes, inline constants.

Constants become initializers stored as typed lists (``float_data``, ``int64_data``, ...)
rather than raw bytes, so a model printed as protobuf text stays readable.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = 8  # the oldest IR that carries opset 17: any recent ONNX Runtime loads it

ELEMENT_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
                 "int64": TensorProto.INT64, "bool": TensorProto.BOOL}
NUMPY_TYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64,
               "bool": np.bool_}

Dims = Sequence[int | str]


def tensor_from_array(name: str, array: np.ndarray) -> TensorProto:
    """An initializer with its values as a typed list (readable in text format)."""
    dtype = array.dtype.name
    if dtype not in ELEMENT_TYPES:
        raise ValueError(f"no ONNX element type for {dtype}")
    return helper.make_tensor(name, ELEMENT_TYPES[dtype], list(array.shape),
                              array.flatten().tolist(), raw=False)


class GraphBuilder:
    """Accumulates nodes and initializers; ``op`` returns the (single) output name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._count = 0

    # -- graph interface -----------------------------------------------------------------
    def add_input(self, name: str, dtype: str, dims: Dims) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, ELEMENT_TYPES[dtype], dims))
        return name

    def add_output(self, name: str, value: str, dtype: str, dims: Dims) -> None:
        """Expose ``value`` under the graph output name ``name``."""
        self.nodes.append(helper.make_node("Identity", [value], [name], name=f"out_{name}"))
        self.outputs.append(helper.make_tensor_value_info(name, ELEMENT_TYPES[dtype], dims))

    # -- values --------------------------------------------------------------------------
    def initializer(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(tensor_from_array(name, np.asarray(array)))
        return name

    def const(self, hint: str, value, dtype: str = "float32") -> str:
        """A fresh initializer holding ``value`` (scalar or array) of ``dtype``."""
        return self.initializer(self._fresh(hint), np.asarray(value, NUMPY_TYPES[dtype]))

    def op(self, op_type: str, inputs: Sequence[str], hint: str | None = None, **attrs) -> str:
        out = self._fresh(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def _fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    # -- common idioms -------------------------------------------------------------------
    def to_float32(self, value: str, dtype: str) -> str:
        if dtype == "float32":
            return value
        return self.op("Cast", [value], "f32", to=TensorProto.FLOAT)

    def from_float32(self, value: str, dtype: str) -> str:
        return value if dtype == "float32" else self.op("Cast", [value], "cast",
                                                        to=ELEMENT_TYPES[dtype])

    def slice_last(self, value: str, start: int, end: int, axis: int, hint: str) -> str:
        return self.op("Slice", [value, self.const("start", [start], "int64"),
                                 self.const("end", [end], "int64"),
                                 self.const("axis", [axis], "int64")], hint)

    def pick(self, value: str, index: int, axis: int, hint: str) -> str:
        """``value`` at ``index`` along ``axis``, that axis removed."""
        return self.op("Gather", [value, self.const("index", index, "int64")], hint, axis=axis)

    def unsqueeze(self, value: str, axes: Sequence[int], hint: str = "unsq") -> str:
        return self.op("Unsqueeze", [value, self.const("axes", list(axes), "int64")], hint)

    def squeeze(self, value: str, axes: Sequence[int], hint: str = "sq") -> str:
        return self.op("Squeeze", [value, self.const("axes", list(axes), "int64")], hint)

    def dim(self, value: str, axis: int, hint: str) -> str:
        """Scalar int64: the extent of ``value`` on ``axis``."""
        return self.squeeze(self.op("Shape", [value], hint, start=axis, end=axis + 1), [0], hint)

    def round_clip(self, value: str, low: float, high: float, hint: str) -> str:
        rounded = self.op("Round", [value], hint)
        return self.op("Clip", [rounded, self.const("lo", low), self.const("hi", high)], hint)

    def model(self, check: bool = True) -> onnx.ModelProto:
        """The model, checked (``full_check``) unless ``check`` is False: the checker
        serializes the model, which protobuf refuses above 2 GiB; such a model is checked
        by path once written with external data. The initializers move into the model, each
        released once copied (protobuf copies on append), so the weights are held once, not
        once per copy: the builder is spent afterwards."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="builders", ir_version=IR_VERSION)
        self.initializers.reverse()
        while self.initializers:
            model.graph.initializer.append(self.initializers.pop())
        if check:
            onnx.checker.check_model(model, full_check=True)
        return model
