"""The one dtype table: a metadata dtype name -> its numpy dtype, ONNX element type and ONNX
Runtime type string. Every layer reads its dtype facts from here.

    DTYPES["float16"].numpy        # dtype('float16')
    DTYPES["float16"].onnx         # 10 (onnx.TensorProto.FLOAT16)
    DTYPES["float16"].ort          # "tensor(float16)"
    dtype_of_onnx(10), dtype_of_ort("tensor(float)")   # "float16", "float32"
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    name: str              # the metadata spelling
    numpy: np.dtype | None  # None: no numpy storage here (float8 variants)
    onnx: int | None       # onnx.TensorProto element type; None: ONNX has none
    ort: str | None        # OrtValue.data_type() / NodeArg.type; None: ORT has none

    @property
    def is_float(self) -> bool:
        return self.name.startswith(("float", "bfloat"))


def _entry(name: str, numpy, onnx: int | None, ort: str | None) -> tuple[str, DType]:
    return name, DType(name, None if numpy is None else np.dtype(numpy), onnx, ort)


DTYPES: dict[str, DType] = dict([
    _entry("float32", np.float32, 1, "tensor(float)"),
    _entry("float16", np.float16, 10, "tensor(float16)"),
    _entry("bfloat16", ml_dtypes.bfloat16, 16, "tensor(bfloat16)"),
    _entry("float8_e4m3fn", ml_dtypes.float8_e4m3fn, 17, "tensor(float8e4m3fn)"),
    _entry("float8_e4m3", None, None, None),
    _entry("float8_e5m2", ml_dtypes.float8_e5m2, 19, "tensor(float8e5m2)"),
    _entry("int8", np.int8, 3, "tensor(int8)"),
    _entry("int16", np.int16, 5, "tensor(int16)"),
    _entry("int32", np.int32, 6, "tensor(int32)"),
    _entry("int64", np.int64, 7, "tensor(int64)"),
    _entry("uint8", np.uint8, 2, "tensor(uint8)"),
    _entry("uint16", np.uint16, 4, "tensor(uint16)"),
    _entry("uint32", np.uint32, 12, "tensor(uint32)"),
    _entry("uint64", np.uint64, 13, "tensor(uint64)"),
    _entry("bool", np.bool_, 9, "tensor(bool)"),
])
DTYPE_NAMES: tuple[str, ...] = tuple(DTYPES)
FLOAT8_DTYPES = ("float8_e4m3fn", "float8_e4m3", "float8_e5m2")
# The dtypes a Value can hold (numpy storage, and ONNX Runtime moves them): float8 excluded.
NUMPY_DTYPES: dict[str, np.dtype] = {
    name: d.numpy for name, d in DTYPES.items()
    if d.numpy is not None and name not in FLOAT8_DTYPES}
_BY_ONNX = {d.onnx: name for name, d in DTYPES.items() if d.onnx is not None}
_BY_ORT = {d.ort: name for name, d in DTYPES.items() if d.ort is not None}


def dtype_of_onnx(element_type: int) -> str | None:
    """The metadata name of an ONNX element type (None: not one of ours)."""
    return _BY_ONNX.get(element_type)


def dtype_of_ort(type_string: str) -> str | None:
    """The metadata name of an ONNX Runtime type string such as ``tensor(float)``."""
    return _BY_ORT.get(type_string)
