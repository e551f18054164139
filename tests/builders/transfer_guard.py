"""A guard that makes every device -> host path except the seam's ``download`` raise.

residency.md §6 forbids, in the decode path, ``OrtValue.numpy()``, ``copy_outputs_to_cpu()``
and ``cupy.asnumpy``/``.get()`` outside ``adopt``: each would be host staging. Inside
:func:`forbid_host_transfers` those calls raise :class:`TransferGuardError` unless they run
inside :meth:`CudaBackend.download <speculant.tensors.cuda.CudaBackend.download>`. ONNX
Runtime values that already live on the CPU are not a crossing and stay allowed.

Used by the CUDA tests (fixture ``transfer_guard`` in ``tests/tensors/conftest.py``); it
patches classes process-wide while active, so it is a test and debugging tool, not a mode.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from speculant.errors import ResidencyError
from speculant.tensors.cuda import in_seam_download


class TransferGuardError(ResidencyError):
    """A device -> host copy outside the seam's ``adopt`` (host staging)."""


def _refuse(what: str) -> TransferGuardError:
    return TransferGuardError(
        f"{what} copies device memory to the host outside the seam's adopt (host staging)",
        remedy="compute where the value lives through the seam, or read it back explicitly "
               "with seam.adopt(value, 'host') / seam.read_token_ids(ids)")


def _is_cpu(ort_value: Any) -> bool:
    return ort_value.device_name().lower() == "cpu"


@contextlib.contextmanager
def forbid_host_transfers() -> Iterator[list[str]]:
    """Patch CuPy's and ONNX Runtime's device -> host calls to raise outside ``download``.

    Yields the list of patched names (``"cupy.asnumpy"``, ...); libraries that are not
    installed are skipped. Everything is restored on exit.
    """
    patches: list[tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = []

    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        def guard_cupy(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
            def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
                @functools.wraps(original)
                def guarded(*args: Any, **kwargs: Any) -> Any:
                    if not in_seam_download():
                        raise _refuse(name)
                    return original(*args, **kwargs)
                return guarded
            return wrap

        patches.append((cupy, "asnumpy", guard_cupy("cupy.asnumpy")))
        for method in ("get", "tolist", "item"):
            patches.append((cupy.ndarray, method, guard_cupy(f"cupy.ndarray.{method}")))

    try:
        import onnxruntime
    except ImportError:
        onnxruntime = None
    if onnxruntime is not None:
        def wrap_numpy(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
                if not in_seam_download() and not _is_cpu(self):
                    raise _refuse(f"OrtValue.numpy() on '{self.device_name()}'")
                return original(self, *args, **kwargs)
            return guarded

        def wrap_copy_outputs(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
                if not in_seam_download() and not all(_is_cpu(o) for o in self.get_outputs()):
                    raise _refuse("IOBinding.copy_outputs_to_cpu() with device outputs")
                return original(self, *args, **kwargs)
            return guarded

        patches.append((onnxruntime.OrtValue, "numpy", wrap_numpy))
        patches.append((onnxruntime.IOBinding, "copy_outputs_to_cpu", wrap_copy_outputs))

    undo: list[tuple[Any, str, bool, Any]] = []  # owner, name, had its own attribute, it
    try:
        for owner, name, wrap in patches:
            own = vars(owner).get(name)
            undo.append((owner, name, name in vars(owner), own))
            setattr(owner, name, wrap(getattr(owner, name)))
        yield [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name, _ in patches]
    finally:
        for owner, name, had_own, own in reversed(undo):
            if had_own:
                setattr(owner, name, own)
            else:
                delattr(owner, name)
