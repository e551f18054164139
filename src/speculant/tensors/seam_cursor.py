"""Writes at positions that live where the tensors do (docs/design/spec/residency.md §3): a round
queued behind another (speculative/round.py) learns its start ``C`` and its chain context
from the last round's acceptance ``[a, c_1 …]`` without the host reading it first. Each
reads an index from a device value and writes an owned buffer there; nothing crosses to the
host. A part of :class:`~speculant.tensors.seam.TensorSeam`, kept in its own module."""

from __future__ import annotations

from speculant.errors import ContractError
from speculant.tensors.value import Value

INDEX_DTYPES = ("int32", "int64")


class CursorOps:
    """Mixed into TensorSeam: uses its ``backend_for``, ``_same_residency`` and
    ``_check_int_slots``."""

    def write_arange_from(self, dst: Value, start: Value, step: int = 1,
                          offset: int = 0) -> Value:
        """``start[0] + offset + step · i`` into flat slot ``i`` of the owned integer ``dst``,
        ``start`` [1] int32 or int64 where ``dst`` lives (``step`` 0: the one number in
        every slot: a length)."""
        self._check_int_slots("write_arange_from", dst, 0, dst.size)
        self._check_index("write_arange_from", start, "start")
        self._same_residency("write_arange_from", dst, start, "dst", "start")
        self.backend_for("write_arange_from", dst, "dst").write_arange_from(
            dst, start, int(step), int(offset))
        return dst

    def take_at(self, dst: Value, src: Value, axis: int, index: Value,
                offset: int = 0) -> Value:
        """``src``'s position ``index[0] + offset`` on ``axis`` (kept, extent 1) into the
        owned ``dst`` of that shape's size and ``src``'s dtype; ``index`` [1] int32 or int64
        where both live. A position outside ``[0, extent)`` is clamped into it (the device
        cannot raise; the callers' indices come from an acceptance count ``1 … k + 1``)."""
        op = "take_at"
        if not dst.owned or dst.dtype != src.dtype:
            raise ContractError(f"{op}: dst {dst.describe()} must be an owned buffer of src's "
                                f"dtype ({src.describe()})", value=dst.dtype,
                                expected=f"an owned {src.dtype} buffer")
        self._check_axis(op, src, axis)
        if src.shape[axis] == 0 or dst.size * src.shape[axis] != src.size:
            raise ContractError(f"{op}: dst {dst.describe()} does not hold one position of "
                                f"{src.describe()} on axis {axis}", value=dst.shape,
                                expected=f"{src.size // max(src.shape[axis], 1)} elements")
        self._check_index(op, index, "index")
        self._same_residency(op, dst, src, "dst", "src")
        self._same_residency(op, dst, index, "dst", "index")
        self.backend_for(op, dst, "dst").take_at(dst, src, axis, index, int(offset))
        return dst

    def add_first(self, total: Value, counts: Value) -> Value:
        """``total[0] += counts[0]`` where both live (a cursor advanced by a count)."""
        self._check_int_slots("add_first", total, 0, 1)
        self._check_index("add_first", counts, "counts", any_size=True)
        self._same_residency("add_first", total, counts, "total", "counts")
        self.backend_for("add_first", total, "total").add_first(total, counts)
        return total

    @staticmethod
    def _check_index(op: str, index: Value, role: str, *, any_size: bool = False) -> None:
        if index.dtype not in INDEX_DTYPES or (index.size != 1 and not any_size) or \
                index.size == 0:
            raise ContractError(f"{op}: {role} must be one int32 or int64, got "
                                f"{index.describe()}", value=index.shape,
                                expected="[1] int32 or int64")
