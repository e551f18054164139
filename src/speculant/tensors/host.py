"""The host backend (numpy): the living definition of every seam operation.

:class:`HostBackend` is the reference implementation of
:class:`~speculant.tensors.backend.Backend`: each method states in numpy what a device backend
must compute byte for byte. Host work is ordered by program order, so the ordering methods
(``write_batch``, ``synchronize``) do nothing and no stream is shared.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from speculant.errors import ContractError
from speculant.tensors import sampling as sampling_math
from speculant.tensors.acceptance import accept_greedy
from speculant.tensors.backend import ResidencyCounters
from speculant.tensors.sampling import Sampling
from speculant.tensors.value import HOST, NO_TOKEN, NUMPY_DTYPES, Value, window_is_view


def argmax_rows_numpy(rows: np.ndarray) -> np.ndarray:
    """The argmax of every row of ``rows`` ``[R, V]`` (float32 already widened): the lowest
    index of the row's maximum, or ``NO_TOKEN`` where that maximum is not a finite number (a
    NaN or ``+inf`` anywhere in the row, or every element ``-inf``). Result ``[R]`` int32."""
    ids = np.argmax(rows, axis=1).astype(np.int32)  # [R] int32; a row's first NaN wins here
    ids[~np.isfinite(rows[np.arange(rows.shape[0]), ids])] = NO_TOKEN  # R reads, not R·V
    return ids


def widen_rows(x: Value) -> np.ndarray:
    """``x`` as ``[R, V]`` float32 rows, widened exactly (bfloat16: its bits are
    the top half of a float32)."""
    rows = x.data.reshape(-1, x.shape[-1])  # [R, V] x.dtype
    if x.dtype == "bfloat16":
        return sampling_math.widen_bfloat16(np, rows)
    return rows.astype(np.float32, copy=False)


class _Borrowed:
    """Memory someone else owns, as numpy sees it: the base of the arrays :meth:`HostBackend.wrap`
    makes, so that ``owner`` lives as long as any array over the memory."""

    def __init__(self, pointer: int, shape: tuple[int, ...], dtype: np.dtype, owner: Any) -> None:
        self.__array_interface__ = {"data": (pointer, True), "shape": shape,
                                    "typestr": dtype.str, "version": 3}
        self.owner = owner


class HostBackend:
    """numpy implementations; arguments are validated by the seam before they get here."""

    device_kind = HOST
    ordering = "shared_stream"  # program order: nothing to fence

    def __init__(self) -> None:
        self.counters = ResidencyCounters()  # replaced by the seam's own

    def unsupported_reason(self, residency: str) -> str | None:
        return None if residency == HOST else f"'{residency}' is not the host"

    @contextlib.contextmanager
    def write_batch(self) -> Iterator[None]:
        yield  # host writes are done when the call returns

    def synchronize(self, residency: str) -> None:
        pass  # nothing is queued on the host

    def window(self, v: Value, axis: int, start: int, length: int) -> Value:
        index = [slice(None)] * v.rank
        index[axis] = slice(start, start + length)
        window = v.data[tuple(index)]
        if window_is_view(v.shape, axis, length):
            return Value(window, HOST, v.dtype, owner=v, owned=False, kind=v.kind)
        return Value(np.asarray(window, order="C"), HOST, v.dtype, owned=True, kind=v.kind)

    def gather(self, table: Value, ids: Sequence[int]) -> Value:
        rows = table.data[np.asarray(ids, dtype=np.int64)]  # [n, W] table dtype (a copy)
        return Value(np.asarray(rows, order="C"), HOST, table.dtype, owned=True)

    def scatter(self, dst: Value, src: Value, offset: int) -> None:
        width = src.shape[-1] if src.rank else 1
        dst_rows = dst.data.reshape(-1, dst.shape[-1])  # [R, D] view of dst (C-contiguous)
        src_rows = np.array(src.data.reshape(-1, width), copy=True)  # [r, w] copy-first
        dst_rows[:, offset : offset + width] = src_rows

    def zeros(self, shape: Sequence[int], dtype: str, residency: str) -> Value:
        return Value(np.zeros(tuple(shape), NUMPY_DTYPES[dtype]), HOST, dtype, owned=True)

    def write_ints(self, dst: Value, values: Sequence[int], offset: int) -> None:
        dst.data.reshape(-1)[offset:offset + len(values)] = values

    def write_arange(self, dst: Value, start: int) -> None:
        flat = dst.data.reshape(-1)  # [n] view of dst
        flat[...] = np.arange(start, start + flat.size, dtype=flat.dtype)

    def write_arange_from(self, dst: Value, start: Value, step: int, offset: int) -> None:
        flat = dst.data.reshape(-1)  # [n] view of dst
        first = int(start.data.reshape(-1)[0]) + offset
        flat[...] = first + step * np.arange(flat.size, dtype=flat.dtype)

    def take_at(self, dst: Value, src: Value, axis: int, index: Value, offset: int) -> None:
        at = min(max(int(index.data.reshape(-1)[0]) + offset, 0), src.shape[axis] - 1)
        dst.data.reshape(-1)[...] = np.take(src.data, at, axis=axis).reshape(-1)

    def add_first(self, total: Value, counts: Value) -> None:
        total.data.reshape(-1)[0] += counts.data.reshape(-1)[0]

    def write_ids(self, dst: Value, ids: Value, offset: int) -> None:
        dst.data.reshape(-1)[offset:offset + ids.size] = ids.data.reshape(-1)

    def accept(self, drafts: Value, choices: Value) -> Value:
        out = accept_greedy(np, drafts.data.reshape(-1), choices.data.reshape(-1))  # [k + 2]
        return Value(out, HOST, "int32", owned=True, kind="token_ids")

    def argmax(self, x: Value) -> Value:
        ids = argmax_rows_numpy(widen_rows(x))  # [R] int32
        return Value(ids, HOST, "int32", owned=True, kind="token_ids")

    # -- sampling (the math is tensors/sampling.py, shared with CUDA) ---------------------
    def distribution(self, x: Value, sampling: Sampling) -> Value:
        rows = widen_rows(x).astype(np.float64)  # [R, V] float64, exact
        probs = sampling_math.distribution_rows(np, rows, sampling)  # [R, V] float64
        return Value(probs.astype(np.float32), HOST, "float32", owned=True)

    def keyed(self, x: Value, sampling: Sampling, key: int, start: int) -> Value:
        rows = widen_rows(x).astype(np.float64)  # [R, V] float64, exact
        positions = np.arange(start, start + rows.shape[0], dtype=np.uint64)  # [R]
        ids = sampling_math.sample_keyed(np, rows, sampling, key, positions)
        return Value(ids.astype(np.int32), HOST, "int32", owned=True, kind="token_ids")

    def sample(self, probs: Value, uniforms: Sequence[float]) -> Value:
        u = np.asarray(uniforms, np.float64)  # [R]
        ids = sampling_math.sample_rows(np, probs.data.reshape(-1, probs.shape[-1]), u)
        return Value(ids.astype(np.int32), HOST, "int32", owned=True, kind="token_ids")

    def rejection(self, p: Value, q: Sequence[Value] | None, drafts: Sequence[int],
                  uniforms: Sequence[float]) -> Value:
        width = p.shape[-1]
        q_rows = None if q is None else np.concatenate(
            [v.data.reshape(-1, v.shape[-1]) for v in q])[None]  # [1, k, V_q] float32
        a, token = sampling_math.rejection_sample(
            np, p.data.reshape(1, -1, width), q_rows,
            np.asarray([list(drafts)], np.int64).reshape(1, len(drafts)),
            np.asarray([list(uniforms)], np.float64))
        ids = np.asarray([a[0], token[0]], np.int32)  # [2]: a, then the correction or bonus
        return Value(ids, HOST, "int32", owned=True, kind="token_ids")

    # -- transfers: on the host each is a copy into a new owned value ----------------------
    def download(self, v: Value, after: Any = None) -> np.ndarray:
        return np.array(v.data, order="C", copy=True)

    def mark(self, residency: str) -> float:
        return time.perf_counter()

    def is_done(self, mark: float) -> bool:
        return True  # the host's work is done when its call returns

    def seconds_between(self, begin: float, end: float) -> float:
        return end - begin

    def upload(self, v: Value, residency: str) -> Value:
        return Value(np.array(v.data, order="C", copy=True), HOST, v.dtype, owned=True,
                     kind=v.kind)

    def peer_copy(self, v: Value, residency: str) -> Value:
        return self.upload(v, residency)

    # -- primitives for a session (session/binding.py) ---------------------------------------
    def pointer(self, v: Value) -> int:
        if not v.data.flags.c_contiguous:
            raise ContractError(f"{v.describe()} is not C-contiguous, so it has no one address",
                                expected="a C-contiguous host value")
        return int(v.data.__array_interface__["data"][0])

    def compute_stream(self, residency: str) -> int | None:
        return None  # the host has no stream

    def wrap(self, pointer: int, shape: Sequence[int], dtype: str, residency: str,
             owner: Any) -> Value:
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) == 0:
            return Value(np.zeros(shape, NUMPY_DTYPES[dtype]), HOST, dtype, owned=True)
        storage = np.dtype(np.uint16) if dtype == "bfloat16" else NUMPY_DTYPES[dtype]
        array = np.asarray(_Borrowed(pointer, shape, storage, owner))
        return Value(array.view(NUMPY_DTYPES[dtype]), HOST, dtype, owner=owner, owned=False)
