"""The seam that serves a device: ``cpu`` -> the host seam, ``cuda:N`` -> a seam with the CUDA
backend of ordinal N (no silent CPU fallback)."""

from __future__ import annotations

from speculant.tensors.seam import TensorSeam
from speculant.tensors.value import HOST, Residency


def make_seam(device: str = "cpu", *, ordering: str = "shared_stream") -> TensorSeam:
    """The seam for a runtime that executes on ``device`` (read by :meth:`Residency.parse`).

    For CUDA it builds a :class:`~speculant.tensors.cuda.CudaBackend` for that ordinal and
    raises :class:`ResidencyError` at once, naming the ordinal, when CuPy, a GPU or that
    ordinal is missing. There is no silent CPU fallback.
    ``ordering`` is ``"shared_stream"`` (default: ONNX Runtime runs on the seam's stream) or
    ``"fence"`` (the seam synchronizes its stream after every write batch).
    """
    residency = Residency.parse(device)
    if residency.kind == HOST:
        return TensorSeam()
    from speculant.tensors.cuda import CudaBackend

    return TensorSeam({"cuda": CudaBackend(residency.ordinal, ordering=ordering)})
