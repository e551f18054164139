"""`TensorSeam`: one `TensorOps` that runs each operation where its principal input lives.

The seam validates arguments once (rules S1-S7 of residency.md §3) and hands the work to the
backend of the principal's residency: :class:`HostBackend` for ``host`` and, when installed
and enabled, the CUDA backend for ``cuda:N``. It never copies a value to the host to proceed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from speculant.errors import ContractError, ResidencyError
from speculant.tensors.host import HostBackend
from speculant.tensors.ops import ResidencyCounters
from speculant.tensors.value import FLOAT_DTYPES, HOST, NUMPY_DTYPES, Value


def device_kind(residency: str) -> str:
    return residency.split(":", 1)[0]


class TensorSeam:
    """The one implementation of :class:`~speculant.tensors.ops.TensorOps`."""

    def __init__(self, device_backends: dict[str, Any] | None = None) -> None:
        self.counters = ResidencyCounters()
        self.host = HostBackend()
        # device kind -> backend (e.g. {"cuda": CudaBackend}); host is always there.
        self.device_backends: dict[str, Any] = dict(device_backends or {})
        for backend in self.device_backends.values():
            backend.counters = self.counters

    # -- dispatch -------------------------------------------------------------------------
    def backend_for(self, op: str, v: Value) -> Any:
        if v.residency == HOST:
            return self.host
        backend = self.device_backends.get(device_kind(v.residency))
        if backend is None:
            raise ResidencyError(
                f"{op}: no implementation for residency '{v.residency}' in this build "
                f"(operand {v.describe()})",
                value=v.residency,
                remedy=(
                    "install and enable the implementation for that device "
                    "(pip install 'speculant[cuda]' and load with device='cuda'), "
                    "or adopt the value to the host explicitly with adopt(v, 'host')"
                ),
            )
        return backend

    def _same_residency(self, op: str, principal: Value, other: Value, role: str) -> None:
        if principal.residency != other.residency:
            raise ResidencyError(
                f"{op}: operands straddle residencies: principal {principal.describe()}, "
                f"{role} {other.describe()}",
                remedy=(
                    f"adopt the {role} into {principal.residency} first, or adopt the principal "
                    f"to {other.residency} and run there"
                ),
            )

    @staticmethod
    def _empty(shape: Sequence[int], dtype: str, kind: str = "tensor") -> Value:
        return Value(np.zeros(tuple(shape), NUMPY_DTYPES[dtype]), HOST, dtype, owned=True,
                     kind=kind)  # type: ignore[arg-type]

    # -- operations -----------------------------------------------------------------------
    def slice_axis(self, v: Value, axis: int, start: int, length: int) -> Value:
        if not 0 <= axis < v.rank:
            raise ContractError(f"slice_axis: axis {axis} outside rank {v.rank} of {v.describe()}",
                                value=axis, expected=f"0 <= axis < {v.rank}")
        extent = v.shape[axis]
        if start < 0 or length < 0 or start + length > extent:
            raise ContractError(
                f"slice_axis: window [{start}, {start + length}) outside extent {extent} of axis "
                f"{axis} of {v.describe()}",
                value=(start, length), expected=f"0 <= start, 0 <= length, start + length <= {extent}")
        shape = list(v.shape)
        shape[axis] = length
        if 0 in shape:
            return self._empty(shape, v.dtype, v.kind)
        if start == 0 and length == extent:
            return v
        return self.backend_for("slice_axis", v).window(v, axis, start, length)

    def last_along_axis(self, v: Value, axis: int) -> Value:
        if 0 <= axis < v.rank and v.shape[axis] == 0:
            raise ContractError(f"last_along_axis: axis {axis} of {v.describe()} is empty",
                                value=0, expected="extent >= 1")
        return self.slice_axis(v, axis, v.shape[axis] - 1 if 0 <= axis < v.rank else 0, 1)

    def truncate_axis(self, v: Value, axis: int, length: int) -> Value:
        if 0 <= axis < v.rank and length > v.shape[axis]:
            raise ContractError(
                f"truncate_axis: length {length} exceeds extent {v.shape[axis]} of axis {axis} "
                f"of {v.describe()}", value=length, expected=f"<= {v.shape[axis]}")
        return self.slice_axis(v, axis, 0, length)

    def gather_rows(self, table: Value, ids: Sequence[int]) -> Value:
        if table.rank != 2:
            raise ContractError(f"gather_rows: table must be rank 2, got {table.describe()}",
                                value=table.shape, expected="[R, W]")
        num_rows = table.shape[0]
        bad = [i for i in ids if not 0 <= int(i) < num_rows]
        if bad:
            raise ContractError(f"gather_rows: ids {bad} outside [0, {num_rows}) of the table",
                                value=bad, expected=f"0 <= id < {num_rows}")
        if len(ids) == 0 or table.shape[1] == 0:
            return self._empty((len(ids), table.shape[1]), table.dtype)
        return self.backend_for("gather_rows", table).gather(table, [int(i) for i in ids])

    def scatter_into_last_axis(self, dst: Value, src: Value, offset: int) -> Value:
        self._same_residency("scatter_into_last_axis", dst, src, "source")
        if not dst.owned:
            raise ContractError(
                f"scatter_into_last_axis: destination {dst.describe()} is not owned by speculant "
                "(a component output or a view of one may alias a cell)",
                expected="a buffer from zeros(), adopt() or a strided copy")
        if dst.dtype != src.dtype:
            raise ContractError(f"scatter_into_last_axis: dtype {src.dtype} of the source differs "
                                f"from {dst.dtype} of the destination", value=src.dtype,
                                expected=dst.dtype)
        width = src.shape[-1] if src.rank else 1
        src_rows = src.size // width if width else 0
        dst_width = dst.shape[-1] if dst.rank else 1
        dst_rows = dst.size // dst_width if dst_width else 0
        if src_rows not in (dst_rows, 1) or offset < 0 or offset + width > dst_width:
            raise ContractError(
                f"scatter_into_last_axis: cannot write {src.describe()} at offset {offset} into "
                f"{dst.describe()}", value=(src.shape, offset),
                expected=f"rows {dst_rows} or 1, 0 <= offset, offset + {width} <= {dst_width}")
        if dst.size == 0 or src.size == 0:
            return dst
        self.backend_for("scatter_into_last_axis", dst).scatter(dst, src, offset)
        return dst

    def zeros(self, shape: Sequence[int], dtype: str, residency: str) -> Value:
        if 0 in shape:
            return self._empty(shape, dtype)
        probe = Value(None, residency, dtype)
        if residency == HOST:
            return self.host.zeros(shape, dtype, residency)
        return self.backend_for("zeros", probe).zeros(shape, dtype, residency)

    def argmax_rows(self, x: Value) -> Value:
        if x.dtype not in FLOAT_DTYPES:
            raise ContractError(f"argmax_rows: scores must be float32, float16 or bfloat16, got "
                                f"{x.describe()}", value=x.dtype, expected="a float dtype")
        if x.rank == 0 or x.shape[-1] == 0:
            raise ContractError(f"argmax_rows: score rows of width 0 in {x.describe()}",
                                value=x.shape, expected="last extent >= 1")
        if x.size == 0:
            return self._empty((0,), "int32", "token_ids")
        return self.backend_for("argmax_rows", x).argmax(x)

    def adopt(self, v: Value, residency: str) -> Value:
        if v.residency == residency:
            return v
        if v.size == 0:
            return self._empty(v.shape, v.dtype, v.kind)
        if residency == HOST:  # device -> host: the only read-back path
            array = self.backend_for("adopt", v).download(v)
            self.counters.device_readback_bytes += int(array.nbytes)
            if v.kind != "token_ids":
                self.counters.host_staging_count += 1
            return Value(array, HOST, v.dtype, owned=True, kind=v.kind)
        target = self.backend_for("adopt", Value(None, residency, v.dtype))
        if v.residency == HOST:
            self.counters.uploads += 1
            return target.upload(v, residency)
        self.backend_for("adopt", v)  # the source device must have an implementation too
        return target.peer_copy(v, residency)

    # -- token ids ------------------------------------------------------------------------
    def read_token_ids(self, ids: Value) -> list[int]:
        """Token ids as Python ints: the one read-back the decode path makes on purpose."""
        if ids.kind != "token_ids":
            raise ContractError(f"read_token_ids: {ids.describe()} is not a token-ids value",
                                expected="the result of argmax_rows or a sampler")
        return [int(i) for i in self.adopt(ids, HOST).data.reshape(-1)]
