"""ONNX Runtime <-> CUDA `Value`s without a copy (residency.md §6).

* :func:`stream_provider_options` - the CUDA provider options that put a session on the
  backend's stream (``user_compute_stream``; none in ``fence`` mode).
* :func:`bind_device_input` - bind a ``cuda:N`` value by pointer, element type and shape.
  ``IOBinding.bind_input`` takes the ONNX element type as an integer since ONNX Runtime 1.20
  (microsoft/onnxruntime#22306), which covers bfloat16: no DLPack round trip is needed.
* :func:`bind_device_output` - bind an output to ``cuda:N``, optionally into an owned buffer.
* :func:`wrap_ort_output` - an output ``OrtValue`` on CUDA as a ``Value`` over the same
  memory: ``data_ptr()`` wrapped as ``cupy.cuda.UnownedMemory`` whose owner is the
  ``OrtValue`` (kept alive as long as any array over it). This is what DLPack would do, in a
  few microseconds instead of a capsule round trip per output, and it covers bfloat16, which
  CuPy has no dtype for (stored as ``uint16`` words).

Nothing here copies device bytes to the host; CuPy is imported only when needed.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from speculant.errors import ContractError
from speculant.tensors.cuda import cuda_ordinal, import_cupy, storage_dtype
from speculant.tensors.value import HOST, NUMPY_DTYPES, Value

# Metadata dtype -> ONNX TensorProto.DataType (onnx.TensorProto.FLOAT == 1, ...).
ONNX_ELEMENT_TYPES: dict[str, int] = {
    "float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
    "bool": 9, "float16": 10, "uint32": 12, "uint64": 13, "bfloat16": 16,
}
DTYPE_OF_ONNX: dict[int, str] = {code: name for name, code in ONNX_ELEMENT_TYPES.items()}
# OrtValue.data_type() strings -> metadata dtype.
DTYPE_OF_ORT_TYPE: dict[str, str] = {
    f"tensor({onnx_name})": name for name, onnx_name in (
        ("float32", "float"), ("float16", "float16"), ("bfloat16", "bfloat16"),
        ("int8", "int8"), ("int16", "int16"), ("int32", "int32"), ("int64", "int64"),
        ("uint8", "uint8"), ("uint16", "uint16"), ("uint32", "uint32"), ("uint64", "uint64"),
        ("bool", "bool"))
}


def stream_provider_options(backend: Any, residency: str) -> dict[str, str]:
    """CUDA provider options for a session on ``residency`` sharing the backend's stream.

    ``shared_stream`` mode: ``user_compute_stream`` = ``str(stream.ptr)`` (never the null
    stream, which ORT reads as "no stream"). ``fence`` mode: no stream option; the seam fences.
    The caller adds ``device_id`` and ``use_tf32``.
    """
    if backend.ordering != "shared_stream":
        return {}
    stream = backend.stream_for(residency)
    return {"has_user_compute_stream": "1", "user_compute_stream": str(int(stream.ptr))}


def _require_device_value(what: str, value: Value) -> int:
    ordinal = cuda_ordinal(value.residency)
    if not value.data.flags.c_contiguous:
        raise ContractError(f"{what}: {value.describe()} is not C-contiguous",
                            expected="a C-contiguous CUDA value")
    if value.dtype not in ONNX_ELEMENT_TYPES:
        raise ContractError(f"{what}: dtype {value.dtype} has no ONNX element type",
                            value=value.dtype, expected=f"one of {sorted(ONNX_ELEMENT_TYPES)}")
    return ordinal


def keep_alive(binding: Any, name: str, value: Value) -> None:
    """Keep ``value`` alive as long as the binding refers to its memory."""
    try:
        kept = binding.__dict__.setdefault("_speculant_bound", {})
    except AttributeError:  # a binding without a __dict__: the caller keeps the value alive
        return
    kept[name] = value


@functools.lru_cache(maxsize=16)
def ort_device(kind: str, ordinal: int) -> Any:
    """ONNX Runtime's device object for ``kind`` (``"cuda"``, ``"cpu"``) ``ordinal``, made
    once: ``IOBinding``'s Python methods make a new one per call."""
    import onnxruntime as ort

    return ort.OrtDevice.make(kind, ordinal)._get_c_device()


def raw_binding(binding: Any) -> Any:
    """The C-level binding under ONNX Runtime's Python ``IOBinding`` (the same methods,
    without the per-call wrapper work), or ``binding`` itself when it is already that."""
    return getattr(binding, "_iobinding", binding)


def bind_device_input(binding: Any, name: str, value: Value) -> None:
    """Bind the ``cuda:N`` ``value`` as input ``name``: pointer, ONNX element type, shape."""
    ordinal = _require_device_value("bind_device_input", value)
    raw_binding(binding).bind_input(name, ort_device("cuda", ordinal),
                                    ONNX_ELEMENT_TYPES[value.dtype], list(value.shape),
                                    int(value.data.data.ptr))
    keep_alive(binding, name, value)


def bind_device_output(binding: Any, name: str, residency: str,
                       value: Value | None = None) -> None:
    """Bind output ``name`` to ``residency`` (``cuda:N``).

    Without ``value`` ONNX Runtime allocates (shape unknown before the run); with an owned
    ``value`` of the right shape the output is written into it.
    """
    ordinal = cuda_ordinal(residency)
    if value is None:
        raw_binding(binding).bind_output(name, ort_device("cuda", ordinal))
        return
    if value.residency != residency or not value.owned:
        raise ContractError(f"bind_device_output: output '{name}' can only be written into an "
                            f"owned buffer on {residency}, got {value.describe()}",
                            expected=f"a buffer from zeros(shape, dtype, '{residency}')")
    _require_device_value("bind_device_output", value)
    binding.bind_output(name, "cuda", ordinal, ONNX_ELEMENT_TYPES[value.dtype],
                        list(value.shape), int(value.data.data.ptr))
    keep_alive(binding, name, value)


def ort_value_dtype(ort_value: Any) -> str:
    """The metadata dtype of an ``OrtValue`` holding a tensor."""
    element_type = getattr(ort_value, "element_type", None)
    if element_type is not None:
        code = int(element_type())
        if code in DTYPE_OF_ONNX:
            return DTYPE_OF_ONNX[code]
    type_name = ort_value.data_type()
    if type_name in DTYPE_OF_ORT_TYPE:
        return DTYPE_OF_ORT_TYPE[type_name]
    raise ContractError(f"ONNX Runtime output of type {type_name} has no speculant dtype",
                        value=type_name, expected=f"one of {sorted(DTYPE_OF_ORT_TYPE)}")


def wrap_ort_output(ort_value: Any, residency: str, dtype: str | None = None) -> Value:
    """The CUDA output ``ort_value`` as a ``Value`` on ``residency``, sharing its memory.

    ``dtype`` (when given) must agree with the OrtValue's element type. A zero-element output
    becomes a host value (S2). The result is ``owned=False`` with ``owner=ort_value``.
    """
    ordinal = cuda_ordinal(residency)
    device = ort_value.device_name().lower()
    if device != "cuda":
        raise ContractError(f"wrap_ort_output: the output lives on '{device}', not on CUDA",
                            value=device, expected=f"an output bound to {residency}")
    actual = ort_value_dtype(ort_value)
    if dtype is not None and dtype != actual:
        raise ContractError(f"wrap_ort_output: the output is {actual}, expected {dtype}",
                            value=actual, expected=dtype)
    shape = tuple(int(d) for d in ort_value.shape())
    if math.prod(shape) == 0:
        return Value(np.zeros(shape, NUMPY_DTYPES[actual]), HOST, actual, owned=True)
    cupy = import_cupy(residency)
    storage = storage_dtype(actual)
    with cupy.cuda.Device(ordinal):
        array = _from_pointer(cupy, ort_value, shape, storage, ordinal)
    return Value(array, residency, actual, owner=ort_value, owned=False)


def _from_pointer(cupy: Any, ort_value: Any, shape: tuple[int, ...], storage: np.dtype,
                  ordinal: int) -> Any:
    """CuPy over ``data_ptr()`` as unowned memory kept alive by the OrtValue."""
    num_bytes = math.prod(shape) * storage.itemsize
    memory = cupy.cuda.UnownedMemory(int(ort_value.data_ptr()), num_bytes, ort_value, ordinal)
    return cupy.ndarray(shape, storage, memptr=cupy.cuda.MemoryPointer(memory, 0))
