"""Device names to residencies and the seam that serves them: ``cpu`` -> the host seam,
``cuda:N`` -> a seam with the CUDA backend of ordinal N (no silent CPU fallback)."""

from __future__ import annotations

from speculant.errors import ResidencyError
from speculant.tensors.backend import INSTALL_CUDA
from speculant.tensors.seam import TensorSeam
from speculant.tensors.value import HOST


def residency_for_device(device: str) -> str:
    """The residency ``device`` names: ``cpu``/``host`` -> ``host``, ``cuda`` -> ``cuda:0``."""
    if device in ("cpu", HOST):
        return HOST
    if device == "cuda":
        return "cuda:0"
    if device.startswith("cuda:") and device[5:].isdigit():
        return f"cuda:{int(device[5:])}"
    raise ResidencyError(
        f"unknown device '{device}': speculant runs on the host ('cpu') or on CUDA ('cuda', "
        "'cuda:N')", value=device, expected="'cpu', 'cuda' or 'cuda:N'",
        remedy=f"load with device='cpu', or device='cuda:N' after {INSTALL_CUDA}")


def make_seam(device: str = "cpu", *, ordering: str = "shared_stream") -> TensorSeam:
    """The seam for a runtime that executes on ``device`` (``cpu``, ``cuda`` or ``cuda:N``).

    For CUDA it builds a :class:`~speculant.tensors.cuda.CudaBackend` for that ordinal and
    raises :class:`ResidencyError` at once, naming the ordinal, when CuPy, a GPU or that
    ordinal is missing. There is no silent CPU fallback.
    ``ordering`` is ``"shared_stream"`` (default: ONNX Runtime runs on the seam's stream) or
    ``"fence"`` (the seam synchronizes its stream after every write batch).
    """
    residency = residency_for_device(device)
    if residency == HOST:
        return TensorSeam()
    from speculant.tensors.cuda import CudaBackend

    return TensorSeam({"cuda": CudaBackend(int(residency.split(":")[1]), ordering=ordering)})
