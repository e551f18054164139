"""The host backend (numpy): the living definition of every seam operation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from speculant.tensors.value import HOST, NUMPY_DTYPES, Value, window_is_view


def argmax_rows_numpy(rows: np.ndarray) -> np.ndarray:
    """The argmax rule of runtime.md §7 over ``rows`` ``[R, V]`` (float32 already widened).

    NaN is ignored, the lowest index wins ties, ``+inf`` wins, an all ``-inf`` row yields its
    first non-NaN index and an all-NaN row yields 0. Result ``[R]`` int32.
    """
    is_nan = np.isnan(rows)  # [R, V] bool
    key = np.where(is_nan, np.float32(-np.inf), rows)  # [R, V] float32
    row_max = key.max(axis=1, keepdims=True)  # [R, 1] float32
    hit = (key == row_max) & ~is_nan  # [R, V] bool
    return np.argmax(hit, axis=1).astype(np.int32)  # first True; 0 when none


def widen_bfloat16_bits(words: np.ndarray) -> np.ndarray:
    """bfloat16 words (any 16-bit view) as float32, exactly: the bits go to the top half."""
    return (words.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def widen_rows(x: Value) -> np.ndarray:
    """``x`` as ``[R, V]`` float32 rows, widened exactly (residency.md §4, "bfloat16")."""
    rows = x.data.reshape(-1, x.shape[-1])  # [R, V] x.dtype
    if x.dtype == "bfloat16":
        return widen_bfloat16_bits(np.asarray(rows, order="C"))
    return rows.astype(np.float32)


class HostBackend:
    """numpy implementations; arguments are validated by the seam before they get here."""

    device_kind = HOST

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

    def argmax(self, x: Value) -> Value:
        ids = argmax_rows_numpy(widen_rows(x))  # [R] int32
        return Value(ids, HOST, "int32", owned=True, kind="token_ids")
