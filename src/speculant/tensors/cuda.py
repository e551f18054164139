"""The CUDA backend (CuPy): every seam operation on ``cuda:N``, byte for byte like the host.

Importing this module never imports CuPy; constructing :class:`CudaBackend` does, and raises
:class:`~speculant.errors.ResidencyError` naming what to install when CuPy, a GPU or the
ordinal is missing. The seam validates every argument first, so these methods only compute.
Its streams, counting allocator and bfloat16 words: docs/design/tensors.md, "The CUDA backend".
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import weakref
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from speculant.errors import INSTALL_CUDA, ContractError, ResidencyError
from speculant.tensors.backend import ResidencyCounters
from speculant.tensors.cuda_cursor import CudaCursor
from speculant.tensors.cuda_kernels import (
    ARGMAX_THREADS,
    accept_greedy_kernel,
    first_argmax_rows,
    write_ints_kernel,
)
from speculant.tensors.cuda_sampling import CudaSampling
from speculant.tensors.sampling import widen_bfloat16
from speculant.tensors.value import HOST, NUMPY_DTYPES, Value, cuda_ordinal, window_is_view

ORDERINGS = ("shared_stream", "fence")

# True while CudaBackend.download runs: the one device->host path (see transfer_guard.py).
_IN_DOWNLOAD: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "speculant_in_seam_download", default=False)


# Device ordinal -> its non-blocking cupy.cuda.Stream: one per device per process.
_DEVICE_STREAMS: dict[int, Any] = {}
_READER_STREAMS: dict[int, Any] = {}  # ordinal -> the stream of read-backs made after a mark


def in_seam_download() -> bool:
    """Whether the current call stack is inside the seam's ``download`` (adopt to host)."""
    return _IN_DOWNLOAD.get()


def storage_dtype(dtype: str) -> np.dtype:
    """The CuPy storage dtype of a metadata dtype (bfloat16 as uint16 words)."""
    return np.dtype(np.uint16) if dtype == "bfloat16" else NUMPY_DTYPES[dtype]


def import_cupy(residency: str = "cuda") -> ModuleType:
    """CuPy, or a ResidencyError that says what to install."""
    try:
        import cupy
    except ImportError as exc:
        raise ResidencyError(
            f"residency '{residency}' needs CuPy, which cannot be imported ({exc})",
            value=residency,
            remedy=f"{INSTALL_CUDA} (CuPy for CUDA 13 and onnxruntime-gpu), or load with "
                   "device='cpu'") from exc
    return cupy


def cuda_device_count(cupy: ModuleType) -> tuple[int, str]:
    """How many CUDA devices CuPy sees, and why none when it sees none."""
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except (RuntimeError, OSError) as exc:  # CUDARuntimeError: no driver, no device
        return 0, str(exc)
    return count, "" if count else "the CUDA runtime reports 0 devices"


class _Allocation:
    """Owner record of one counted device buffer (see the module docstring)."""

    __slots__ = ("block", "__weakref__")

    def __init__(self, block: Any) -> None:
        self.block = block  # cupy.cuda.MemoryPointer from the pool


def _release(counters: ResidencyCounters, num_bytes: int) -> None:
    counters.live_device_allocations -= 1
    counters.live_device_bytes -= num_bytes


class CudaBackend(CudaSampling, CudaCursor):
    """CuPy implementations of the seam operations for ``cuda:N`` values.

    ``ordinal`` is the device this runtime executes on (its stream is created at once);
    values on other visible ordinals are served too, each under its own stream.
    ``ordering`` is ``"shared_stream"`` (default: sessions share :attr:`stream`, no fences) or
    ``"fence"`` (every write batch ends with a counted ``stream.synchronize()``).
    """

    device_kind = "cuda"

    def __init__(self, ordinal: int = 0, *, ordering: str = "shared_stream") -> None:
        residency = f"cuda:{ordinal}"
        if ordering not in ORDERINGS:
            raise ContractError(f"ordering {ordering!r} is not one of {ORDERINGS}",
                                value=ordering, expected=" or ".join(ORDERINGS))
        self._cp = import_cupy(residency)
        self.num_devices, why = cuda_device_count(self._cp)
        if self.num_devices == 0:
            raise ResidencyError(
                f"residency '{residency}' (ordinal {ordinal}) is unusable: no CUDA device is "
                f"visible ({why})", value=residency,
                remedy="run on a machine with an NVIDIA GPU and driver (check nvidia-smi and "
                       f"CUDA_VISIBLE_DEVICES; {INSTALL_CUDA}), or load with device='cpu'")
        if not 0 <= ordinal < self.num_devices:
            raise ResidencyError(
                f"residency '{residency}': there is no CUDA device with ordinal {ordinal}; this "
                f"machine has {self.num_devices} (ordinals 0..{self.num_devices - 1})",
                value=ordinal, expected=f"0 <= ordinal < {self.num_devices}",
                remedy=f"load with device='cuda:N' for N < {self.num_devices}, or with "
                       "device='cpu'")
        self.ordinal = ordinal
        self.residency = residency
        self.ordering = ordering
        self.counters = ResidencyCounters()  # replaced by the seam's own
        self._batch_depth = 0
        self._pending_fences: set[int] = set()
        self.stream_for(residency)

    # -- streams and ordering ---------------------------------------------------------------
    @property
    def stream(self) -> Any:
        """The non-blocking ``cupy.cuda.Stream`` of :attr:`ordinal` (handle: ``stream.ptr``)."""
        return self.stream_for(self.residency)

    def stream_for(self, residency: str) -> Any:
        """The stream of the device of ``residency`` (created on first use, once per process)."""
        ordinal = cuda_ordinal(residency)
        stream = _DEVICE_STREAMS.get(ordinal)
        if stream is None:
            with self._cp.cuda.Device(ordinal):
                stream = _DEVICE_STREAMS.setdefault(
                    ordinal, self._cp.cuda.Stream(non_blocking=True))
        return stream

    def unsupported_reason(self, residency: str) -> str | None:
        """Why this backend cannot serve the CUDA residency ``residency``, or None when it
        can."""
        ordinal = cuda_ordinal(residency)
        if ordinal >= self.num_devices:
            return (f"there is no CUDA device with ordinal {ordinal} (this machine has "
                    f"{self.num_devices}: ordinals 0..{self.num_devices - 1})")
        return None

    @contextlib.contextmanager
    def _on(self, ordinal: int) -> Iterator[Any]:
        """Make device ``ordinal`` and its stream current; yields the stream."""
        stream = self.stream_for(f"cuda:{ordinal}")
        with self._cp.cuda.Device(ordinal), stream:
            yield stream

    @contextlib.contextmanager
    def write_batch(self) -> Iterator[None]:
        """Writes issued inside end with one fence per device written (``fence`` mode only)."""
        self._batch_depth += 1
        try:
            yield
        finally:
            self._batch_depth -= 1
            if self._batch_depth == 0:
                pending, self._pending_fences = self._pending_fences, set()
                for ordinal in sorted(pending):
                    self._fence(ordinal)

    def _wrote(self, ordinal: int) -> None:
        if self.ordering != "fence":
            return
        if self._batch_depth:
            self._pending_fences.add(ordinal)
        else:
            self._fence(ordinal)

    def _fence(self, ordinal: int) -> None:
        self.stream_for(f"cuda:{ordinal}").synchronize()
        self.counters.fences += 1

    # -- the counting allocator -------------------------------------------------------------
    def _allocate(self, ordinal: int, shape: Sequence[int], dtype: np.dtype) -> Any:
        """A new owned, counted, uninitialized C-contiguous array (call under ``_on``)."""
        cp = self._cp
        num_bytes = math.prod(shape) * np.dtype(dtype).itemsize
        record = _Allocation(cp.cuda.alloc(num_bytes))
        counters = self.counters
        counters.live_device_allocations += 1
        counters.live_device_bytes += num_bytes
        weakref.finalize(record, _release, counters, num_bytes).atexit = False
        memory = cp.cuda.UnownedMemory(record.block.ptr, num_bytes, record, ordinal)
        return cp.ndarray(tuple(shape), dtype, memptr=cp.cuda.MemoryPointer(memory, 0))

    # -- operations (arguments already validated by the seam) --------------------------------
    def window(self, v: Value, axis: int, start: int, length: int) -> Value:
        ordinal = cuda_ordinal(v.residency)
        index: list[slice] = [slice(None)] * v.rank
        index[axis] = slice(start, start + length)
        with self._on(ordinal) as stream:
            part = v.data[tuple(index)]  # a CuPy view, no bytes move
            if window_is_view(v.shape, axis, length):
                return Value(part, v.residency, v.dtype, owner=v, owned=False, kind=v.kind)
            out = self._allocate(ordinal, part.shape, v.data.dtype)
            if not v.data.flags.c_contiguous:  # not from the seam; one copy kernel
                self._cp.copyto(out, part)
                self._wrote(ordinal)
                return Value(out, v.residency, v.dtype, owned=True, kind=v.kind)
            # rows: one per outer index, each `length` positions; one 2-D copy, no kernel
            step = math.prod(v.shape[axis + 1:]) * v.data.dtype.itemsize  # bytes per position
            runtime = self._cp.cuda.runtime
            runtime.memcpy2DAsync(
                out.data.ptr, length * step, v.data.data.ptr + start * step,
                v.shape[axis] * step, length * step, math.prod(v.shape[:axis]),
                runtime.memcpyDeviceToDevice, stream.ptr)
            self._wrote(ordinal)
        return Value(out, v.residency, v.dtype, owned=True, kind=v.kind)

    def gather(self, table: Value, ids: Sequence[int]) -> Value:
        ordinal = cuda_ordinal(table.residency)
        row_bytes = table.shape[1] * table.data.dtype.itemsize
        with self._on(ordinal) as stream:
            out = self._allocate(ordinal, (len(ids), table.shape[1]), table.data.dtype)
            for j, row in enumerate(ids):  # one device-to-device copy per row; no host bytes
                (out.data + j * row_bytes).copy_from_device_async(
                    table.data.data + row * row_bytes, row_bytes, stream)
            self._wrote(ordinal)
        return Value(out, table.residency, table.dtype, owned=True)

    def scatter(self, dst: Value, src: Value, offset: int) -> None:
        ordinal = cuda_ordinal(dst.residency)
        width = src.shape[-1] if src.rank else 1
        with self._on(ordinal) as stream:
            dst_rows = dst.data.reshape(-1, dst.shape[-1])  # [R, D] view of dst
            src_rows = src.data.reshape(-1, width)  # [r, w]
            if _overlaps(src.data, dst.data):
                src_rows = src_rows.copy()  # copy-first: src aliases dst
            if src_rows.shape[0] == dst_rows.shape[0] and src_rows.flags.c_contiguous:
                item = dst.data.dtype.itemsize  # one 2-D copy: R rows of w elements
                runtime = self._cp.cuda.runtime
                runtime.memcpy2DAsync(
                    dst_rows.data.ptr + offset * item, dst_rows.shape[1] * item,
                    src_rows.data.ptr, width * item, width * item, dst_rows.shape[0],
                    runtime.memcpyDeviceToDevice, stream.ptr)
            else:  # one source row into every row: a broadcast copy kernel
                dst_rows[:, offset : offset + width] = src_rows
            self._wrote(ordinal)

    def zeros(self, shape: Sequence[int], dtype: str, residency: str) -> Value:
        ordinal = cuda_ordinal(residency)
        with self._on(ordinal) as stream:
            out = self._allocate(ordinal, shape, storage_dtype(dtype))
            out.data.memset_async(0, out.nbytes, stream)
            self._wrote(ordinal)
        return Value(out, residency, dtype, owned=True)

    # -- a pass's small inputs written in place: values travel as kernel arguments -------
    def write_ints(self, dst: Value, values: Sequence[int], offset: int) -> None:
        ordinal = cuda_ordinal(dst.residency)
        with self._on(ordinal):
            flat = dst.data.reshape(-1)  # [n] view of dst (int32 or int64: the seam checked)
            if len(set(values)) == 1 and len(values) > 4:
                flat[offset:offset + len(values)].fill(values[0])  # one fill kernel
            else:  # the values as kernel arguments: one launch per four
                kernel = write_ints_kernel(self._cp, dst.dtype, "write_ints")
                for at in range(0, len(values), 4):
                    chunk = [*values[at:at + 4], 0, 0, 0, 0][:4]
                    kernel((1,), (1,), (flat, np.int32(offset + at),
                                        np.int32(min(4, len(values) - at)),
                                        *(np.int64(v) for v in chunk)))
            self._wrote(ordinal)

    def write_arange(self, dst: Value, start: int) -> None:
        ordinal = cuda_ordinal(dst.residency)
        with self._on(ordinal):
            flat = dst.data.reshape(-1)  # [n] view of dst (int32 or int64)
            blocks = min(-(-flat.size // 128), 64)  # one kernel, no temporary
            write_ints_kernel(self._cp, dst.dtype, "write_arange")(
                (blocks,), (128,), (flat, np.int32(flat.size), np.int64(start)))
            self._wrote(ordinal)

    def write_ids(self, dst: Value, ids: Value, offset: int) -> None:
        ordinal = cuda_ordinal(dst.residency)
        with self._on(ordinal):
            flat = dst.data.reshape(-1)  # [n] view of dst
            flat[offset:offset + ids.size] = ids.data.reshape(-1)  # a converting copy kernel
            self._wrote(ordinal)

    def accept(self, drafts: Value, choices: Value) -> Value:
        ordinal = cuda_ordinal(drafts.residency)
        k = drafts.size
        with self._on(ordinal):  # tensors/acceptance.py's rule as one kernel launch
            out = self._allocate(ordinal, (k + 2,), np.dtype(np.int32))  # [k + 2] int32
            accept_greedy_kernel(self._cp)((1,), (1,), (
                self._cp.ascontiguousarray(drafts.data.reshape(-1)),
                self._cp.ascontiguousarray(choices.data.reshape(-1)), np.int32(k), out))
        return Value(out, drafts.residency, "int32", owned=True, kind="token_ids")

    def argmax(self, x: Value) -> Value:
        """The host's argmax (each row's first maximum; NO_TOKEN where it is not finite) as one
        kernel (cuda_kernels.first_argmax_rows) over float32 or float16 rows (a half widened
        exactly as it is read); bfloat16 is widened exactly first."""
        cp = self._cp
        ordinal = cuda_ordinal(x.residency)
        width = x.shape[-1]
        with self._on(ordinal):
            rows = x.data.reshape(-1, width)  # [R, V] storage dtype
            score_type = "float"
            if x.dtype == "bfloat16":
                wide = widen_bfloat16(cp, rows)  # [R, V] float32, a new contiguous array
            elif x.dtype == "float16":  # its bits, widened as the kernel reads them
                wide = cp.ascontiguousarray(rows).view(cp.uint16)  # [R, V] float16 bits
                score_type = "unsigned short"
            else:
                wide = cp.ascontiguousarray(rows.astype(cp.float32, copy=False))  # [R, V]
            out = self._allocate(ordinal, (rows.shape[0],), np.dtype(np.int32))  # [R] int32
            first_argmax_rows(cp, score_type)((rows.shape[0],), (ARGMAX_THREADS,), (
                wide, np.int32(rows.shape[0]), np.int32(width), out))
        return Value(out, x.residency, "int32", owned=True, kind="token_ids")

    # -- crossings (the seam counts them) ----------------------------------------------------
    def synchronize(self, residency: str) -> None:
        """Block until everything issued on the stream of ``residency`` has run."""
        self.stream_for(residency).synchronize()

    def download(self, v: Value, after: Any = None) -> np.ndarray:
        """The only device -> host path: a blocking copy on the value's stream, or ``after``
        a mark on the device's reader stream (waiting for that event alone)."""
        ordinal = cuda_ordinal(v.residency)
        token = _IN_DOWNLOAD.set(True)
        try:
            with self._on(ordinal) as stream:
                if after is not None:  # the reader stream, after that event alone
                    stream = _READER_STREAMS.get(ordinal) or self._cp.cuda.Stream(non_blocking=True)
                    _READER_STREAMS[ordinal] = stream
                    stream.wait_event(after)
                array = v.data.get(stream=stream)  # in stream order, after every write
                stream.synchronize()  # blocking on every CuPy release, not only recent ones
        finally:
            _IN_DOWNLOAD.reset(token)
        return np.asarray(array, order="C").view(NUMPY_DTYPES[v.dtype])

    def mark(self, residency: str) -> Any:
        with self._on(cuda_ordinal(residency)) as stream:
            return stream.record()  # a cupy.cuda.Event, timing enabled

    def is_done(self, mark: Any) -> bool:
        return bool(mark.done)  # cudaEventQuery: no wait

    def seconds_between(self, begin: Any, end: Any) -> float:
        end.synchronize()
        return self._cp.cuda.get_elapsed_time(begin, end) / 1e3  # milliseconds -> seconds

    def upload(self, v: Value, residency: str) -> Value:
        ordinal = cuda_ordinal(residency)
        words = np.asarray(v.data, order="C").view(storage_dtype(v.dtype))
        with self._on(ordinal) as stream:
            out = self._allocate(ordinal, v.shape, words.dtype)
            out.set(words, stream=stream)
            self._wrote(ordinal)
        return Value(out, residency, v.dtype, owned=True, kind=v.kind)

    def peer_copy(self, v: Value, residency: str) -> Value:
        source, target = cuda_ordinal(v.residency), cuda_ordinal(residency)
        with self._on(source) as source_stream:
            produced = source_stream.record()  # v is complete on its own stream here
        with self._on(target) as stream:
            stream.wait_event(produced)
            out = self._allocate(target, v.shape, v.data.dtype)
            out.data.copy_from_device_async(v.data.data, v.nbytes, stream)
            copied = stream.record()
            self._wrote(target)
        with self._on(source) as source_stream:
            source_stream.wait_event(copied)  # v's block is not reused before the copy ends
        return Value(out, residency, v.dtype, owned=True, kind=v.kind)

    # -- primitives for a session (session/binding.py binds ONNX Runtime with them) -------
    def pointer(self, v: Value) -> int:
        if not v.data.flags.c_contiguous:
            raise ContractError(f"{v.describe()} is not C-contiguous, so it has no one address",
                                expected="a C-contiguous CUDA value")
        return int(v.data.data.ptr)

    def compute_stream(self, residency: str) -> int | None:
        """``stream.ptr`` of ``residency``'s stream in ``shared_stream`` mode (never 0: the
        null stream reads as "no stream" to ONNX Runtime); None in ``fence`` mode."""
        if self.ordering != "shared_stream":
            return None
        return int(self.stream_for(residency).ptr)

    def wrap(self, pointer: int, shape: Sequence[int], dtype: str, residency: str,
             owner: Any) -> Value:
        """CuPy over ``pointer`` as ``cupy.cuda.UnownedMemory`` whose owner is ``owner`` (kept
        alive as long as any array over it); bfloat16 as ``uint16`` words. A zero-element
        shape gives a host value (S2)."""
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) == 0:
            return Value(np.zeros(shape, NUMPY_DTYPES[dtype]), HOST, dtype, owned=True)
        cp = self._cp
        ordinal = cuda_ordinal(residency)
        storage = storage_dtype(dtype)
        num_bytes = math.prod(shape) * storage.itemsize
        with self._on(ordinal):
            memory = cp.cuda.UnownedMemory(pointer, num_bytes, owner, ordinal)
            array = cp.ndarray(shape, storage, memptr=cp.cuda.MemoryPointer(memory, 0))
        return Value(array, residency, dtype, owner=owner, owned=False)


def _overlaps(a: Any, b: Any) -> bool:
    """Whether two C-contiguous CuPy arrays share any byte."""
    a_start, b_start = int(a.data.ptr), int(b.data.ptr)
    return a_start < b_start + b.nbytes and b_start < a_start + a.nbytes
