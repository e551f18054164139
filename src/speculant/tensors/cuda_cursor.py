"""The CUDA backend's writes at device positions (tensors/seam_cursor.py): one kernel each,
reading the position or the count where it lives. A part of
:class:`~speculant.tensors.cuda.CudaBackend`, kept in its own module."""

from __future__ import annotations

import math

import numpy as np

from speculant.tensors.cuda_kernels import ELEM_TYPES, INT_TYPES, cursor_kernel
from speculant.tensors.value import Value, cuda_ordinal

THREADS = 128
MAX_BLOCKS = 64


def _blocks(size: int) -> int:
    return max(min(-(-size // THREADS), MAX_BLOCKS), 1)


class CudaCursor:
    """Mixed into CudaBackend: uses its ``_cp``, ``_on`` and ``_wrote``."""

    def write_arange_from(self, dst: Value, start: Value, step: int, offset: int) -> None:
        ordinal = cuda_ordinal(dst.residency)
        with self._on(ordinal):
            flat = dst.data.reshape(-1)  # [n] view of dst (int32 or int64)
            kernel = cursor_kernel(self._cp, "write_arange_from", INT=INT_TYPES[dst.dtype],
                                   IDX=INT_TYPES[start.dtype])
            kernel((_blocks(flat.size),), (THREADS,), (flat, np.int32(flat.size), start.data,
                                                       np.int64(offset), np.int64(step)))
            self._wrote(ordinal)

    def take_at(self, dst: Value, src: Value, axis: int, index: Value, offset: int) -> None:
        ordinal = cuda_ordinal(dst.residency)
        cp = self._cp
        with self._on(ordinal):
            source = cp.ascontiguousarray(src.data)  # the plans' buffers already are
            outer, inner = math.prod(src.shape[:axis]), math.prod(src.shape[axis + 1:])
            kernel = cursor_kernel(cp, "take_at", ELEM=ELEM_TYPES[source.dtype.itemsize],
                                   IDX=INT_TYPES[index.dtype])
            kernel((_blocks(outer * inner),), (THREADS,), (
                source, dst.data.reshape(-1), index.data, np.int64(offset), np.int64(outer),
                np.int64(src.shape[axis]), np.int64(inner)))
            self._wrote(ordinal)

    def add_first(self, total: Value, counts: Value) -> None:
        ordinal = cuda_ordinal(total.residency)
        with self._on(ordinal):
            kernel = cursor_kernel(self._cp, "add_first", INT=INT_TYPES[total.dtype],
                                   IDX=INT_TYPES[counts.dtype])
            kernel((1,), (1,), (total.data, counts.data))
            self._wrote(ordinal)
