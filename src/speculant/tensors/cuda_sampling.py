"""The CUDA backend's sampling operations: tensors/sampling.py over CuPy, as the host runs it
over numpy (the keyed noise's hash is the same uint64 arithmetic); the uniforms are uploaded
(a few bytes), only ids and ``a`` are read back. A part
of :class:`~speculant.tensors.cuda.CudaBackend`, kept in its own module."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from speculant.tensors import sampling as sampling_math
from speculant.tensors.sampling import Sampling, widen_bfloat16
from speculant.tensors.value import Value, cuda_ordinal


class CudaSampling:
    """Mixed into CudaBackend: uses its ``_cp``, ``_on`` and ``_allocate``."""

    def _wide_rows(self, x: Value) -> Any:
        """``x`` as [R, V] float64 rows, widened exactly (call under ``_on``)."""
        cp = self._cp
        rows = x.data.reshape(-1, x.shape[-1])  # [R, V] storage dtype
        if x.dtype == "bfloat16":
            rows = widen_bfloat16(cp, rows)  # [R, V] float32
        return rows.astype(cp.float64)

    def _owned(self, ordinal: int, array: Any, dtype: np.dtype) -> Any:
        """``array`` copied into a counted buffer of ``dtype`` (call under ``_on``)."""
        out = self._allocate(ordinal, array.shape, np.dtype(dtype))
        self._cp.copyto(out, array.astype(dtype))
        return out

    def distribution(self, x: Value, sampling: Sampling) -> Value:
        ordinal = cuda_ordinal(x.residency)
        with self._on(ordinal):
            probs = sampling_math.distribution_rows(self._cp, self._wide_rows(x), sampling)
            out = self._owned(ordinal, probs, np.dtype(np.float32))  # [R, V] float32
        return Value(out, x.residency, "float32", owned=True)

    def keyed(self, x: Value, sampling: Sampling, key: int, start: int) -> Value:
        cp = self._cp
        ordinal = cuda_ordinal(x.residency)
        with self._on(ordinal):
            rows = self._wide_rows(x)  # [R, V] float64
            positions = cp.arange(start, start + rows.shape[0], dtype=cp.uint64)  # [R]
            ids = sampling_math.sample_keyed(cp, rows, sampling, key, positions)
            out = self._owned(ordinal, ids, np.dtype(np.int32))  # [R] int32
        return Value(out, x.residency, "int32", owned=True, kind="token_ids")

    def sample(self, probs: Value, uniforms: Sequence[float]) -> Value:
        cp = self._cp
        ordinal = cuda_ordinal(probs.residency)
        with self._on(ordinal):
            u = cp.asarray(np.asarray(uniforms, np.float64))  # [R] uploaded
            ids = sampling_math.sample_rows(cp, probs.data.reshape(-1, probs.shape[-1]), u)
            out = self._owned(ordinal, ids, np.dtype(np.int32))  # [R] int32
        return Value(out, probs.residency, "int32", owned=True, kind="token_ids")

    def rejection(self, p: Value, q: Sequence[Value] | None, drafts: Sequence[int],
                  uniforms: Sequence[float]) -> Value:
        cp = self._cp
        ordinal = cuda_ordinal(p.residency)
        width = p.shape[-1]
        with self._on(ordinal):
            q_rows = None if q is None else cp.concatenate(
                [v.data.reshape(-1, v.shape[-1]) for v in q])[None]  # [1, k, V_q] float32
            d = cp.asarray(np.asarray(list(drafts), np.int64).reshape(1, len(drafts)))
            u = cp.asarray(np.asarray([list(uniforms)], np.float64))  # [1, k + 1]
            a, token = sampling_math.rejection_sample(cp, p.data.reshape(1, -1, width), q_rows,
                                                      d, u)
            out = self._owned(ordinal, cp.concatenate([a, token]), np.dtype(np.int32))  # [2]
        return Value(out, p.residency, "int32", owned=True, kind="token_ids")
