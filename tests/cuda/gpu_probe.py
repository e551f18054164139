"""Whether the CUDA tests can run here, decided without speculant's code, so a regression in
the seam or the sessions fails a test instead of turning it into a skip."""

from __future__ import annotations

import pytest


def why_no_gpu(*, needs_ort_cuda: bool = True) -> str | None:
    """The reason these tests cannot run here, or None: CuPy's runtime and, when the tests
    create sessions, ONNX Runtime's provider list."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'speculant[cuda]')"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device (getDeviceCount() == 0)"
    except (RuntimeError, OSError) as exc:
        return f"no usable CUDA device ({exc})"
    if not needs_ort_cuda:
        return None
    try:
        import onnxruntime
    except ImportError:
        return "onnxruntime is not installed"
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return "this onnxruntime build has no CUDAExecutionProvider (pip install 'speculant[cuda]')"
    return None


def cuda_marks(*, needs_ort_cuda: bool = True) -> list:
    """``pytestmark`` for a CUDA test module: the ``cuda`` marker and the skip with its reason."""
    reason = why_no_gpu(needs_ort_cuda=needs_ort_cuda)
    return [pytest.mark.cuda, pytest.mark.skipif(reason is not None, reason=str(reason))]
