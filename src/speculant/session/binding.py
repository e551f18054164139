"""ONNX Runtime IO binding of `Value`s, host and device, no copy (docs/design/spec/residency.md §6).

Everything speculant says to ONNX Runtime about memory is here; the tensor backends only offer
the primitives (:class:`~speculant.tensors.backend.Backend`: ``pointer``, ``compute_stream``,
``wrap``).

* :func:`stream_provider_options` - the CUDA provider options that put a session on the
  backend's stream (``user_compute_stream``; none in ``fence`` mode).
* :func:`bind_input` - a host value as ONNX Runtime's numpy input (ORT reads the array's
  memory at each run); a device value by pointer, ONNX element type and shape.
  ``IOBinding.bind_input`` takes the element type as an integer since ONNX Runtime 1.20
  (microsoft/onnxruntime#22306), which covers bfloat16: no DLPack round trip is needed.
* :func:`bind_output` - an output to a residency (ORT allocates), or into an owned buffer.
* :func:`adopt_output` - an output ``OrtValue`` as a ``Value`` over the same memory: on the
  host ORT's own numpy view; on a device the backend's ``wrap`` of ``data_ptr()``, owned by
  the ``OrtValue``. This is what DLPack would do, in a few microseconds instead of a capsule
  round trip per output, and it covers bfloat16 (CuPy stores it as ``uint16`` words).

The binding calls go to the C-level binding under the Python ``IOBinding`` (:func:`raw_binding`:
the same methods without the per-call wrapper work). Nothing here copies device bytes to the
host.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from speculant.dtypes import DTYPES, dtype_of_onnx, dtype_of_ort
from speculant.errors import ContractError
from speculant.tensors import HOST, Backend, Residency, Value


@functools.lru_cache(maxsize=16)
def ort_device(residency: str) -> Any:
    """ONNX Runtime's device object for ``residency``, made once: ``IOBinding``'s Python
    methods make a new one per call."""
    import onnxruntime as ort

    place = Residency.parse(residency)
    kind = "cpu" if place.kind == HOST else place.kind
    return ort.OrtDevice.make(kind, place.ordinal)._get_c_device()


def raw_binding(binding: Any) -> Any:
    """The C-level binding under ONNX Runtime's Python ``IOBinding``, or ``binding`` itself
    when it is already that."""
    return getattr(binding, "_iobinding", binding)


def keep_alive(binding: Any, name: str, value: Value) -> None:
    """Keep ``value`` alive as long as the binding refers to its memory."""
    try:
        kept = binding.__dict__.setdefault("_speculant_bound", {})
    except AttributeError:  # a binding without a __dict__: the caller keeps the value alive
        return
    kept[name] = value


def element_type(what: str, value: Value) -> int:
    """The ONNX element type of ``value``'s dtype."""
    code = DTYPES[value.dtype].onnx if value.dtype in DTYPES else None
    if code is None:
        raise ContractError(f"{what}: dtype {value.dtype} has no ONNX element type",
                            value=value.dtype, expected="an ONNX tensor dtype")
    return code


def stream_provider_options(backend: Backend, residency: str) -> dict[str, str]:
    """CUDA provider options for a session on ``residency`` sharing the backend's stream.

    ``shared_stream`` mode: ``user_compute_stream`` = the stream handle. ``fence`` mode: no
    stream option; the seam fences. The caller adds ``device_id`` and ``use_tf32``.
    """
    handle = backend.compute_stream(residency)
    if handle is None:
        return {}
    return {"has_user_compute_stream": "1", "user_compute_stream": str(handle)}


def bind_input(binding: Any, name: str, value: Value, backend: Backend) -> None:
    """Bind ``value`` as input ``name`` where it lives (``backend`` serves its residency)."""
    if value.residency == HOST:  # ORT uploads it when the session runs elsewhere: no read
        raw_binding(binding).bind_input(name, value.data)
    else:
        raw_binding(binding).bind_input(name, ort_device(value.residency),
                                        element_type("bind_input", value), list(value.shape),
                                        backend.pointer(value))
    keep_alive(binding, name, value)  # ORT reads the memory at each run


def bind_output(binding: Any, name: str, residency: str, value: Value | None = None,
                backend: Backend | None = None) -> None:
    """Bind output ``name`` to ``residency``.

    Without ``value`` ONNX Runtime allocates (the shape is unknown before the run); with an
    owned ``value`` of the right shape on ``residency`` (and its ``backend``) the output is
    written into it, run after run.
    """
    if value is None:
        raw_binding(binding).bind_output(name, ort_device(residency))
        return
    if value.residency != residency or not value.owned or backend is None:
        raise ContractError(f"bind_output: output '{name}' can only be written into an owned "
                            f"buffer on {residency}, got {value.describe()}",
                            expected=f"a buffer from zeros(shape, dtype, '{residency}')")
    raw_binding(binding).bind_output(name, ort_device(residency),
                                     element_type("bind_output", value), list(value.shape),
                                     backend.pointer(value))
    keep_alive(binding, name, value)


def ort_value_dtype(ort_value: Any) -> str:
    """The metadata dtype of an ``OrtValue`` holding a tensor."""
    element = getattr(ort_value, "element_type", None)
    if element is not None:
        name = dtype_of_onnx(int(element()))
        if name is not None:
            return name
    type_name = ort_value.data_type()
    name = dtype_of_ort(type_name)
    if name is None:
        raise ContractError(f"ONNX Runtime output of type {type_name} has no speculant dtype",
                            value=type_name, expected="an ONNX tensor dtype")
    return name


def adopt_output(ort_value: Any, residency: str, backend: Backend,
                 dtype: str | None = None) -> Value:
    """The output ``ort_value`` bound to ``residency`` as a ``Value`` over its memory.

    On the host ``dtype`` (the session's declared output type) is taken as is; on a device it
    must agree with the OrtValue's element type when given. A zero-element device output
    becomes a host value (S2). The result is ``owned=False`` with ``owner=ort_value``.
    """
    if residency == HOST:  # ORT's numpy over the output's memory (kept alive by a capsule)
        array = np.ascontiguousarray(ort_value.numpy())
        return Value(array, HOST, dtype or ort_value_dtype(ort_value), owner=ort_value,
                     owned=False)
    kind = Residency.parse(residency).kind
    device = ort_value.device_name().lower()
    if device != kind:
        raise ContractError(f"adopt_output: the output lives on '{device}', not on {kind}",
                            value=device, expected=f"an output bound to {residency}")
    actual = ort_value_dtype(ort_value)
    if dtype is not None and dtype != actual:
        raise ContractError(f"adopt_output: the output is {actual}, expected {dtype}",
                            value=actual, expected=dtype)
    return backend.wrap(int(ort_value.data_ptr()), ort_value.shape(), actual, residency,
                        ort_value)


def run_bound(session: Any, binding: Any, run_options: Any = None) -> None:
    """ORT's run on ``binding`` (an ``InferenceSession`` and its ``IOBinding``) with
    ``run_options`` (an ``onnxruntime.RunOptions``, e.g. carrying ``gpu_graph_id``; None:
    ORT's defaults): the C-level call where this build has it."""
    raw_session = getattr(session, "_sess", None)
    if raw_session is None or raw_binding(binding) is binding:
        session.run_with_iobinding(binding, run_options)
    else:
        raw_session.run_with_iobinding(raw_binding(binding), run_options)
