"""A small helper for writing ONNX graphs by hand: named nodes, inline constants.

Constants become initializers stored as typed lists (``float_data``, ``int64_data``, ...)
rather than raw bytes, so a model printed as protobuf text stays readable; weights
(:meth:`GraphBuilder.weight`) as raw bytes.

Weights apart: inside ``with weights_apart() as arrays``, each weight of at least
:data:`APART_BYTES` is not copied into protobuf: the graph holds a placeholder (name, type,
dims, ``data_location=EXTERNAL``, no entries yet) and ``arrays`` the array itself (a
reference, not a copy). :func:`write_with_external_data` writes those arrays straight into
``<name>.data`` and :func:`fill_inline` copies them in for an inline file, so a graph written
with external data never holds its weights twice.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the oldest IR that carries opset 17: any recent ONNX Runtime loads it

ELEMENT_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
                 "int64": TensorProto.INT64, "bool": TensorProto.BOOL}
NUMPY_TYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64,
               "bool": np.bool_}

Dims = Sequence[int | str]

APART_BYTES = 1024  # weights this large go apart (onnx's own size_threshold for external data)
ALIGNMENT = 4096  # each tensor in ``<name>.data`` starts at a multiple of this (a page)
_APART: ContextVar[dict[str, np.ndarray] | None] = ContextVar("weights_apart", default=None)


@contextmanager
def weights_apart() -> Iterator[dict[str, np.ndarray]]:
    """While open, :meth:`GraphBuilder.weight` keeps weights of at least :data:`APART_BYTES`
    out of protobuf: the dict yielded maps each one's name to its array (see the module's
    note). The arrays must not change until the graph is written."""
    arrays: dict[str, np.ndarray] = {}
    token = _APART.set(arrays)
    try:
        yield arrays
    finally:
        _APART.reset(token)


def is_apart(tensor: TensorProto, arrays: Mapping[str, np.ndarray]) -> bool:
    """Whether ``tensor`` is a placeholder whose values are ``arrays[tensor.name]``."""
    return (tensor.data_location == TensorProto.EXTERNAL and not tensor.external_data
            and tensor.name in arrays)


def fill_inline(model: onnx.ModelProto, arrays: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """``model`` with each placeholder of ``arrays`` replaced by its values as raw bytes."""
    for tensor in model.graph.initializer:
        if is_apart(tensor, arrays):
            tensor.CopyFrom(numpy_helper.from_array(arrays[tensor.name], tensor.name))
    return model


def write_with_external_data(model: onnx.ModelProto, path: Path,
                             arrays: Mapping[str, np.ndarray]) -> Path:
    """Write ``model`` to ``path`` and every initializer of at least :data:`APART_BYTES` to
    ``<name>.data`` beside it (offsets aligned to :data:`ALIGNMENT`), as
    ``onnx.save_model(save_as_external_data=True)`` would: the placeholders' bytes straight
    from ``arrays``, inline raw bytes moved out of the model. Initializers only (attributes
    and subgraphs stay as they are)."""
    data = path.with_name(path.name + ".data")
    with data.open("wb") as file:
        for tensor in model.graph.initializer:
            if is_apart(tensor, arrays):
                payload = memoryview(np.ascontiguousarray(arrays[tensor.name])).cast("B")
            elif tensor.HasField("raw_data") and len(tensor.raw_data) >= APART_BYTES:
                payload = memoryview(tensor.raw_data)
            else:
                continue
            offset = -file.tell() % ALIGNMENT + file.tell()
            file.seek(offset)
            file.write(payload)
            tensor.ClearField("raw_data")
            tensor.data_location = TensorProto.EXTERNAL
            del tensor.external_data[:]
            for key, value in (("location", data.name), ("offset", offset),
                               ("length", len(payload))):
                tensor.external_data.add(key=key, value=str(value))
    path.write_bytes(model.SerializeToString())
    return path


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

    def weight(self, name: str, array: np.ndarray) -> str:
        """An initializer of raw bytes; inside :func:`weights_apart`, one of at least
        :data:`APART_BYTES` is a placeholder and its array goes apart, uncopied."""
        array = np.ascontiguousarray(array)
        apart = _APART.get()
        if apart is None or array.nbytes < APART_BYTES:
            self.initializers.append(numpy_helper.from_array(array, name))
            return name
        apart[name] = array
        self.initializers.append(TensorProto(
            name=name, dims=array.shape, data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
            data_location=TensorProto.EXTERNAL))
        return name

    @property
    def has_weights_apart(self) -> bool:
        return any(t.data_location == TensorProto.EXTERNAL for t in self.initializers)

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
