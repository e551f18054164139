"""`TensorSeam`: every tensor operation of the decode path, run where its principal input lives.

The seam validates arguments once (docs/design/spec/residency.md §3, S1-S7), then hands it to
:class:`~speculant.tensors.backend.Backend` of the principal's residency: :class:`HostBackend`
for ``host`` and, when installed and enabled, the CUDA backend for ``cuda:N``
(``seam.backend(residency)``). It never copies a value to the host to proceed. Error context
(the operands' shapes) is formatted only when an error is raised.

Checks run in this order: arguments that cannot even be read (axis, residency string), then
S2 (an empty result is a host value, whatever path produced it), then S4 (straddling
operands), then S3 (no implementation for the residency), then the rest of S6/S7.
"""

from __future__ import annotations

import contextlib
import operator
import re
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from speculant.errors import INSTALL_CUDA, ContractError, ResidencyError
from speculant.tensors.backend import Backend, ResidencyCounters
from speculant.tensors.host import HostBackend
from speculant.tensors.seam_cursor import CursorOps
from speculant.tensors.seam_sampling import SamplingOps
from speculant.tensors.value import FLOAT_DTYPES, HOST, NUMPY_DTYPES, Value

INT_IDS = ("int32", "int64")  # the dtypes a pass's token ids, positions and lengths take
_RESIDENCY = re.compile(r"^(host|[a-z][a-z0-9_]*:[0-9]+)$")
# What an error names about an operand: (role, the value or its description, built on demand)
Operand = tuple[str, "Value | Callable[[], str]"]


def device_kind(residency: str) -> str:
    return residency.split(":", 1)[0]


def _check_residency(op: str, residency: object) -> None:
    if not isinstance(residency, str) or not _RESIDENCY.match(residency):
        raise ContractError(f"{op}: residency {residency!r} is not 'host' or '<device>:<ordinal>'",
                            value=residency, expected="'host' or e.g. 'cuda:0'")


def _operands(operands: Sequence[Operand]) -> str:
    return ", ".join(f"{role} {what.describe() if isinstance(what, Value) else what()}"
                     for role, what in operands)


class TensorSeam(SamplingOps, CursorOps):
    """The seam over the host backend and the device backends it is built with."""

    def __init__(self, device_backends: Mapping[str, Backend] | None = None) -> None:
        self.counters = ResidencyCounters()
        self.host = HostBackend()
        # device kind -> backend (e.g. {"cuda": CudaBackend}); the host is always there
        self._backends: dict[str, Backend] = {HOST: self.host, **(device_backends or {})}
        for backend in self._backends.values():
            backend.counters = self.counters
        self._served: dict[str, Backend] = {HOST: self.host}  # residency -> its backend

    @property
    def ordering(self) -> str:
        """How device work is ordered against ONNX Runtime: ``shared_stream`` or ``fence``."""
        modes = {backend.ordering for backend in self._backends.values()}
        return "fence" if "fence" in modes else "shared_stream"

    @contextlib.contextmanager
    def write_batch(self) -> Iterator[None]:
        """Group device writes into one batch: in ``fence`` mode one fence ends the batch.

        Outside a batch every device write is a batch of its own (fenced at once), so an
        omitted ``write_batch`` costs synchronizations, never ordering. Host-only: a no-op.
        """
        with contextlib.ExitStack() as stack:
            for backend in self._backends.values():
                if backend is not self.host:  # host writes are done when their call returns
                    stack.enter_context(backend.write_batch())
            yield

    # -- dispatch -------------------------------------------------------------------------
    def backend(self, residency: str) -> Backend:
        """The backend serving ``residency`` (S3: a ResidencyError when there is none)."""
        return self._backend("backend", residency, ())

    def backend_for(self, op: str, v: Value, role: str = "operand") -> Backend:
        """The backend for the residency of ``v`` (S3: a ResidencyError when there is none)."""
        backend = self._served.get(v.residency)
        return backend if backend is not None else self._backend(op, v.residency, [(role, v)])

    def _backend(self, op: str, residency: str, operands: Sequence[Operand],
                 alternative: str = "") -> Backend:
        backend = self._served.get(residency)
        if backend is not None:
            return backend
        kind = device_kind(residency)
        backend = self._backends.get(kind)
        reason = (f"no '{kind}' implementation is enabled in this seam" if backend is None
                  else backend.unsupported_reason(residency))
        if backend is not None and reason is None:
            self._served[residency] = backend
            return backend
        install = (f"{INSTALL_CUDA} and build the seam with make_seam('{residency}')"
                   if kind == "cuda" else f"speculant has none for '{kind}' yet")
        alternative = alternative or (f"adopt the value to the host explicitly with "
                                      f"adopt(v, 'host') and run {op} there")
        raise ResidencyError(
            f"{op}: cannot run on residency '{residency}': {reason}; operands: "
            f"{_operands(operands)}",
            remedy=f"install and enable the implementation for that device ({install}), or "
                   f"{alternative}")

    def _same_residency(self, op: str, principal: Value, other: Value, principal_role: str,
                        role: str) -> None:
        """S4: operands on different residencies are refused, never staged."""
        if principal.residency != other.residency:
            raise ResidencyError(
                f"{op}: operands straddle residencies: {principal_role} {principal.describe()}, "
                f"{role} {other.describe()}",
                remedy=(f"adopt the {role} into {principal.residency} first "
                        f"(adopt({role}, '{principal.residency}')), or adopt the "
                        f"{principal_role} to {other.residency} and run {op} there"))

    @staticmethod
    def _empty(shape: Sequence[int], dtype: str, kind: str = "tensor") -> Value:
        """S2: a zero-element result is a host value of the right shape and dtype."""
        return Value(np.zeros(tuple(shape), NUMPY_DTYPES[dtype]), HOST, dtype, owned=True,
                     kind=kind)  # type: ignore[arg-type]

    # -- operations -----------------------------------------------------------------------
    def slice_axis(self, v: Value, axis: int, start: int, length: int) -> Value:
        return self._window("slice_axis", v, axis, start, length)

    def last_along_axis(self, v: Value, axis: int) -> Value:
        self._check_axis("last_along_axis", v, axis)
        if v.shape[axis] == 0:
            raise ContractError(f"last_along_axis: axis {axis} of {v.describe()} is empty",
                                value=0, expected="extent >= 1")
        return self._window("last_along_axis", v, axis, v.shape[axis] - 1, 1)

    def truncate_axis(self, v: Value, axis: int, length: int) -> Value:
        self._check_axis("truncate_axis", v, axis)
        extent = v.shape[axis]
        if length > extent or length < 0:
            raise ContractError(
                f"truncate_axis: length {length} outside [0, {extent}] (the extent of axis "
                f"{axis} of {v.describe()})", value=length, expected=f"0 <= length <= {extent}")
        if length == extent:  # v itself
            if v.size:
                self.backend_for("truncate_axis", v, "value")  # S3 even when nothing moves
            return v
        return self._window("truncate_axis", v, axis, 0, length)

    @staticmethod
    def _check_axis(op: str, v: Value, axis: int) -> None:
        if not 0 <= axis < v.rank:
            raise ContractError(f"{op}: axis {axis} outside rank {v.rank} of {v.describe()}",
                                value=axis, expected=f"0 <= axis < {v.rank}")

    def _window(self, op: str, v: Value, axis: int, start: int, length: int) -> Value:
        """All narrowing: the window [start, start + length) of ``axis``."""
        self._check_axis(op, v, axis)
        extent = v.shape[axis]
        if start < 0 or length < 0 or start + length > extent:
            raise ContractError(
                f"{op}: window [{start}, {start + length}) (start {start}, length {length}) "
                f"outside extent {extent} of axis {axis} of {v.describe()}",
                value=(start, length),
                expected=f"0 <= start, 0 <= length, start + length <= {extent}")
        shape = list(v.shape)
        shape[axis] = length
        if 0 in shape:
            return self._empty(shape, v.dtype, v.kind)
        backend = self.backend_for(op, v, "value")
        if start == 0 and length == extent:  # the whole axis: a view of v
            return Value(v.data, v.residency, v.dtype, owner=v, owned=False, kind=v.kind)
        return backend.window(v, axis, start, length)

    def gather_rows(self, table: Value, ids: Sequence[int]) -> Value:
        if isinstance(ids, Value):
            raise ContractError(
                f"gather_rows: ids must be a host sequence of ints (already read back), got the "
                f"value {ids.describe()}", expected="read_token_ids(...) or a list of ints")
        if table.rank != 2:
            raise ContractError(f"gather_rows: table must be rank 2, got {table.describe()}",
                                value=table.shape, expected="[R, W]")
        try:
            row_ids = [operator.index(i) for i in ids]
        except TypeError as exc:
            raise ContractError(f"gather_rows: ids {list(ids)!r} are not all integers",
                                expected="integer row ids") from exc
        num_rows = table.shape[0]
        bad = [i for i in row_ids if not 0 <= i < num_rows]
        if bad:
            raise ContractError(
                f"gather_rows: ids {bad} outside [0, {num_rows}) of the table {table.describe()}",
                value=bad, expected=f"0 <= id < {num_rows}")
        if len(row_ids) == 0 or table.shape[1] == 0:
            return self._empty((len(row_ids), table.shape[1]), table.dtype)
        return self.backend_for("gather_rows", table, "table").gather(table, row_ids)

    def scatter_into_last_axis(self, dst: Value, src: Value, offset: int) -> Value:
        op = "scatter_into_last_axis"
        self._same_residency(op, dst, src, "destination", "source")
        if dst.rank == 0:
            raise ContractError(f"{op}: destination {dst.describe()} has no last axis",
                                value=dst.shape, expected="rank >= 1")
        if dst.dtype != src.dtype:
            raise ContractError(f"{op}: dtype {src.dtype} of the source {src.describe()} differs "
                                f"from {dst.dtype} of the destination {dst.describe()}",
                                value=src.dtype, expected=dst.dtype)
        width = src.shape[-1] if src.rank else 1
        src_rows = src.size // width if width else 0
        dst_width = dst.shape[-1]
        dst_rows = dst.size // dst_width if dst_width else 0
        if src_rows not in (dst_rows, 1) or offset < 0 or offset + width > dst_width:
            raise ContractError(
                f"{op}: cannot write {src.describe()} (as [{src_rows}, {width}]) at offset "
                f"{offset} into {dst.describe()} (as [{dst_rows}, {dst_width}])",
                value=(src.shape, offset),
                expected=f"rows {dst_rows} or 1, 0 <= offset, offset + {width} <= {dst_width}")
        if dst.size == 0 or src.size == 0:
            return dst
        backend = self.backend_for(op, dst, "destination")
        if not dst.owned:
            raise ContractError(
                f"{op}: destination {dst.describe()} is not owned by speculant "
                "(a component output or a view of one may alias a cell)",
                expected="a buffer from zeros(), adopt() or a strided copy")
        if not dst.data.flags.c_contiguous:
            raise ContractError(f"{op}: destination {dst.describe()} is not C-contiguous",
                                expected="a C-contiguous owned buffer")
        backend.scatter(dst, src, offset)
        return dst

    def zeros(self, shape: Sequence[int], dtype: str, residency: str) -> Value:
        try:
            dims = [operator.index(d) for d in shape]
        except TypeError as exc:
            raise ContractError(f"zeros: shape {list(shape)!r} is not a sequence of integers",
                                expected="non-negative integer extents") from exc
        if any(d < 0 for d in dims):
            raise ContractError(f"zeros: shape {dims} has a negative extent", value=dims,
                                expected="non-negative integer extents")
        if dtype not in NUMPY_DTYPES:
            raise ContractError(f"zeros: unknown dtype {dtype!r}", value=dtype,
                                expected=f"one of {sorted(NUMPY_DTYPES)}")
        _check_residency("zeros", residency)
        if 0 in dims:
            return self._empty(dims, dtype)
        backend = self._served.get(residency) or self._backend(
            "zeros", residency,
            [("requested buffer", lambda: f"{dims} {dtype} on {residency}")],
            "allocate it on the host with zeros(shape, dtype, 'host') and run its consumers there")
        return backend.zeros(dims, dtype, residency)

    # -- a pass's small inputs, written where the buffer lives (no host buffer) -----------
    def write_ints(self, dst: Value, values: Sequence[int], offset: int = 0) -> Value:
        """Host ints into the flat slots ``offset …`` of the owned integer ``dst``."""
        self._check_int_slots("write_ints", dst, offset, len(values))
        self.backend_for("write_ints", dst, "dst").write_ints(dst, [int(v) for v in values],
                                                              offset)
        return dst

    def owned_rows(self, buffer: Value, start: int, length: int, *,
                   squeeze: bool = False) -> Value:
        """Rows ``[start, start + length)`` of axis 0 of the owned ``buffer`` as an owned view
        (contiguous; what is written into it lands in the buffer): the slots a pass plan binds.
        ``squeeze``: the one row without its axis."""
        op = "owned_rows"
        if not buffer.owned or buffer.rank == 0:
            raise ContractError(f"{op}: {buffer.describe()} is not an owned buffer with rows",
                                expected="a buffer from zeros() of rank >= 1")
        if start < 0 or length < 0 or start + length > buffer.shape[0] or (
                squeeze and length != 1):
            raise ContractError(
                f"{op}: rows [{start}, {start + length}) of {buffer.describe()}"
                f"{' (squeezed: one row)' if squeeze else ''}", value=(start, length),
                expected=f"0 <= start, start + length <= {buffer.shape[0]}")
        self.backend_for(op, buffer, "buffer")  # a residency the seam serves
        data = buffer.data[start] if squeeze else buffer.data[start:start + length]
        return Value(data, buffer.residency, buffer.dtype, owner=buffer, owned=True)

    def write_arange(self, dst: Value, start: int) -> Value:
        """``start + i`` into flat slot ``i`` of the owned integer ``dst`` (position ids)."""
        self._check_int_slots("write_arange", dst, 0, dst.size)
        self.backend_for("write_arange", dst, "dst").write_arange(dst, int(start))
        return dst

    def write_ids(self, dst: Value, ids: Value, offset: int) -> Value:
        """The integer ``ids`` of ``dst``'s residency into its flat slots ``offset …``."""
        self._check_int_slots("write_ids", dst, offset, ids.size)
        self._same_residency("write_ids", dst, ids, "dst", "ids")
        if ids.dtype not in INT_IDS:
            raise ContractError(f"write_ids: ids must be int32 or int64, got {ids.describe()}",
                                value=ids.dtype, expected="int32 or int64")
        self.backend_for("write_ids", dst, "dst").write_ids(dst, ids, offset)
        return dst

    def accept_greedy(self, drafts: Value, choices: Value) -> Value:
        """``[a, c_1 … c_a, …]`` [k + 2] int32 token ids from the drafts [k] and the target's
        choices [k + 1] (tensors/acceptance.py), computed where they are."""
        if drafts.rank != 1 or choices.rank != 1 or choices.shape[0] != drafts.shape[0] + 1 \
                or drafts.dtype != "int32" or choices.dtype != "int32":
            raise ContractError(f"accept_greedy: drafts {drafts.describe()} must be [k] int32 "
                                f"and choices {choices.describe()} [k + 1] int32",
                                expected="[k] int32 and [k + 1] int32")
        self._same_residency("accept_greedy", drafts, choices, "drafts", "choices")
        return self.backend_for("accept_greedy", drafts, "drafts").accept(drafts, choices)

    @staticmethod
    def _check_int_slots(op: str, dst: Value, offset: int, count: int) -> None:
        if dst.dtype not in INT_IDS or not dst.owned:
            raise ContractError(f"{op}: dst {dst.describe()} must be an owned int32 or int64 "
                                "buffer", value=dst.dtype, expected="an owned integer buffer")
        if not 0 <= offset <= offset + count <= dst.size:
            raise ContractError(f"{op}: slots [{offset}, {offset + count}) outside the "
                                f"{dst.size} of {dst.describe()}", value=offset,
                                expected=f"0 <= offset, offset + count <= {dst.size}")

    def argmax_rows(self, x: Value) -> Value:
        if x.dtype not in FLOAT_DTYPES:
            raise ContractError(f"argmax_rows: scores must be float32, float16 or bfloat16, got "
                                f"{x.describe()}", value=x.dtype, expected="a float dtype")
        if x.rank == 0 or x.shape[-1] == 0:
            raise ContractError(f"argmax_rows: score rows of width 0 in {x.describe()}",
                                value=x.shape, expected="last extent >= 1")
        if x.size == 0:
            return self._empty((0,), "int32", "token_ids")
        return self.backend_for("argmax_rows", x, "scores").argmax(x)

    def adopt(self, v: Value, residency: str) -> Value:
        _check_residency("adopt", residency)
        if v.residency == residency:
            return v
        if v.size == 0:
            return self._empty(v.shape, v.dtype, v.kind)
        operands: list[Operand] = [("value", v), ("target", lambda: f"residency {residency}")]
        source = self._backend(
            "adopt", v.residency, operands,
            "produce the value on the host in the first place (run its producer there)")
        if residency == HOST:  # device -> host: the only read-back path
            array = source.download(v)
            self.counters.device_readback_bytes += int(array.nbytes)
            if v.kind != "token_ids":
                self.counters.host_staging_count += 1
            return Value(array, HOST, v.dtype, owned=True, kind=v.kind)
        target = self._backend(
            "adopt", residency, operands, f"keep the value on {v.residency} and run its "
            f"consumers there")
        if v.residency == HOST:
            self.counters.uploads += 1
            return target.upload(v, residency)
        if device_kind(v.residency) != device_kind(residency):
            raise ResidencyError(
                f"adopt: no direct path from {v.residency} to {residency}; operands: "
                f"{_operands(operands)}",
                remedy=(f"adopt the value to the host first and then into {residency}, or run "
                        f"the consumer on {v.residency}"))
        return target.peer_copy(v, residency)

    def synchronize(self, residency: str) -> None:
        """Wait until the work queued on ``residency`` has finished (no bytes move; a no-op
        on the host). Decoding never needs it (the read-back waits); timing does."""
        if residency != HOST:
            self._backend("synchronize", residency, []).synchronize(residency)

    # -- token ids ------------------------------------------------------------------------
    def read_token_ids(self, ids: Value) -> list[int]:
        """Token ids as Python ints: the one read-back the decode path makes on purpose."""
        if ids.kind != "token_ids":
            raise ContractError(f"read_token_ids: {ids.describe()} is not a token-ids value",
                                expected="the result of argmax_rows or a sampler")
        return [int(i) for i in self.adopt(ids, HOST).data.reshape(-1)]

    def read_token_ids_later(self, ids: Value) -> Callable[[], list[int]]:
        """:meth:`read_token_ids` begun now, finished by calling the result: on a device the
        copy waits for the work queued before this call alone, so more may be queued first."""
        if ids.kind != "token_ids" or ids.residency == HOST:
            values = self.read_token_ids(ids)  # its kind check; on the host nothing waits
            return lambda: values
        backend = self.backend_for("read_token_ids_later", ids, "ids")
        made = backend.mark(ids.residency)  # after the work that makes ids

        def finish() -> list[int]:
            array = backend.download(ids, after=made)
            self.counters.device_readback_bytes += int(array.nbytes)
            return [int(i) for i in array.reshape(-1)]
        return finish
