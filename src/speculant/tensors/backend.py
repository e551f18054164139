"""`Backend`: what a residency's seam implementation provides (docs/design/spec/residency.md §3-9).

The seam (:class:`~speculant.tensors.seam.TensorSeam`) validates every argument and then hands
the work to the backend of the principal operand's residency. A backend only computes; its
methods may assume valid arguments. :class:`~speculant.tensors.host.HostBackend` (numpy) is
the reference: it defines every method, and a device backend
(:class:`~speculant.tensors.cuda.CudaBackend`) must agree with it byte for byte.

Three groups of methods:

* tensor operations: ``window``, ``gather``, ``scatter``, ``zeros``, ``argmax``,
  ``distribution``, ``keyed``, ``sample``, ``rejection``;
* transfers and ordering: ``download``, ``upload``, ``peer_copy``, ``synchronize``,
  ``write_batch``, ``unsupported_reason``;
* the primitives a session needs to hand memory to and from an inference library without a
  copy: ``pointer`` (the address of a value's first byte), ``compute_stream`` (the stream a
  session should share) and ``wrap`` (memory someone else owns, as a `Value`).

`tensors/` knows nothing of ONNX Runtime: the IO binding built on these primitives lives in
:mod:`speculant.session.binding`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from speculant.tensors.sampling import Sampling
from speculant.tensors.value import Value


@dataclass
class ResidencyCounters:
    """Every byte that returns from a device, and every buffer speculant keeps there."""

    host_staging_count: int = 0  # device->host materializations other than token ids
    device_readback_bytes: int = 0  # every device->host byte, by any path
    live_device_allocations: int = 0  # speculant-owned device buffers alive now
    live_device_bytes: int = 0
    fences: int = 0  # fallback fences issued (0 in shared_stream mode)
    uploads: int = 0  # host->device adoptions
    embedding_table_reads: int = 0  # reads of the table from the artifact (<= 1 per runtime)
    embedding_table_mirrors: int = 0  # adoptions of the table into a residency
    graph_captures: int = 0  # CUDA graphs captured (first runs of a pass plan's graph id)
    graph_replays: int = 0  # CUDA graph replays (later runs of a captured plan)

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


class Backend(Protocol):
    """One residency kind's implementation of the seam (see the module docstring).

    ``device_kind`` is the kind it serves (``"host"``, ``"cuda"``); ``counters`` are the
    seam's (the seam assigns its own); ``ordering`` is ``"shared_stream"`` or ``"fence"``.
    """

    device_kind: str
    counters: ResidencyCounters
    ordering: str

    # -- tensor operations (arguments validated by the seam) ------------------------------
    def window(self, v: Value, axis: int, start: int, length: int) -> Value:
        """[start, start + length) of ``axis``: a view when contiguous, else an owned copy."""
        ...

    def gather(self, table: Value, ids: Sequence[int]) -> Value:
        """Rows ``ids`` of the [R, W] ``table``: a new owned [len(ids), W] value."""
        ...

    def scatter(self, dst: Value, src: Value, offset: int) -> None:
        """Write ``src`` into the last axis of the owned ``dst`` at ``offset`` (copy first)."""
        ...

    def zeros(self, shape: Sequence[int], dtype: str, residency: str) -> Value:
        """A new owned value of zeros on ``residency``."""
        ...

    # -- a pass's small inputs written where they live: no host buffer, no upload ----------
    def write_ints(self, dst: Value, values: Sequence[int], offset: int) -> None:
        """Write the host ints ``values`` into the flat slots ``offset …`` of the owned
        integer ``dst`` (on a device: each value a kernel argument)."""
        ...

    def write_arange(self, dst: Value, start: int) -> None:
        """Write ``start + i`` into flat slot ``i`` of the owned integer ``dst``."""
        ...

    def write_arange_from(self, dst: Value, start: Value, step: int, offset: int) -> None:
        """Write ``start[0] + offset + step · i`` into flat slot ``i`` of the owned integer
        ``dst`` (``start`` a device value there: never read by the host)."""
        ...

    def take_at(self, dst: Value, src: Value, axis: int, index: Value, offset: int) -> None:
        """Copy position ``index[0] + offset`` (clamped into the extent) of ``src`` on
        ``axis`` into the owned ``dst`` (validated by the seam)."""
        ...

    def add_first(self, total: Value, counts: Value) -> None:
        """``total[0] += counts[0]``."""
        ...

    def write_ids(self, dst: Value, ids: Value, offset: int) -> None:
        """Copy the integer ``ids`` (same residency) into the flat slots ``offset …`` of the
        owned integer ``dst``, converting to its dtype."""
        ...

    def accept(self, drafts: Value, choices: Value) -> Value:
        """[k + 2] int32 token ids ``[a, c_1 … c_a, …]`` (tensors/acceptance.py)."""
        ...

    def argmax(self, x: Value) -> Value:
        """[R] int32 token ids: per row of ``x``, the first index of its maximum; ``NO_TOKEN``
        for a row whose maximum is not finite (a NaN or ``+inf`` in it, or all ``-inf``)."""
        ...

    def distribution(self, x: Value, sampling: Sampling) -> Value:
        """[R, V] float32 probabilities ``T(row)`` of every score row."""
        ...

    def keyed(self, x: Value, sampling: Sampling, key: int, start: int) -> Value:
        """[R] int32 token ids: per score row ``r`` of ``x``, the Gumbel-max draw from
        ``T(row)`` with the noise keyed by ``(key, start + r, id)``."""
        ...

    def sample(self, probs: Value, uniforms: Sequence[float]) -> Value:
        """[R] int32 token ids, one per row by inverse CDF with the given uniforms."""
        ...

    def rejection(self, p: Value, q: Sequence[Value] | None, drafts: Sequence[int],
                  uniforms: Sequence[float]) -> Value:
        """[2] int32 ``[a, token]``: the rejection sampler of one round."""
        ...

    # -- transfers and ordering -----------------------------------------------------------
    def download(self, v: Value, after: Any = None) -> np.ndarray:
        """The bytes of ``v`` as a new host array of its metadata dtype (the read-back);
        ``after``: a :meth:`mark` made once ``v``'s producer was queued, the one point the
        copy waits for (work queued since runs on)."""
        ...

    def mark(self, residency: str) -> Any:
        """A point in the work queued on ``residency`` so far (a device: an event recorded on
        its stream; the host, where work is done when queued: the clock now)."""
        ...

    def is_done(self, mark: Any) -> bool:
        """Whether the work before ``mark`` has finished (never waits)."""
        ...

    def seconds_between(self, begin: Any, end: Any) -> float:
        """Seconds from mark ``begin`` to mark ``end`` (a device: waits for ``end``)."""
        ...

    def upload(self, v: Value, residency: str) -> Value:
        """The host value ``v`` as a new owned value on ``residency``."""
        ...

    def peer_copy(self, v: Value, residency: str) -> Value:
        """``v`` copied to another residency of this kind, ordered after its producer."""
        ...

    def synchronize(self, residency: str) -> None:
        """Wait until the work queued on ``residency`` has run."""
        ...

    def write_batch(self) -> AbstractContextManager[None]:
        """Writes issued inside form one batch (in ``fence`` mode: one fence at its end)."""
        ...

    def unsupported_reason(self, residency: str) -> str | None:
        """Why this backend cannot serve ``residency``, or None when it can."""
        ...

    # -- primitives for a session (IO binding lives in session/binding.py) ------------------
    def pointer(self, v: Value) -> int:
        """The address of the first byte of the C-contiguous ``v`` (ContractError if not)."""
        ...

    def compute_stream(self, residency: str) -> int | None:
        """The handle of the stream a session on ``residency`` should issue its work on, so
        that it runs in order with the seam's; None when none is shared (host, fence mode)."""
        ...

    def wrap(self, pointer: int, shape: Sequence[int], dtype: str, residency: str,
             owner: Any) -> Value:
        """The memory at ``pointer`` (``shape``, ``dtype``, on ``residency``), which ``owner``
        keeps alive, as a value over it: no copy, ``owned=False``, ``owner=owner``."""
        ...
