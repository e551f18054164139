"""The `TensorOps` protocol and the residency counters (residency.md §3, §4, §9)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

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

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


class TensorOps(Protocol):
    """Every host/device-sensitive operation of the decode path.

    The host implementation (:class:`speculant.tensors.host.HostBackend`) is the
    definition; a device implementation must agree with it byte for byte.
    """

    counters: ResidencyCounters

    def slice_axis(self, v: Value, axis: int, start: int, length: int) -> Value: ...

    def last_along_axis(self, v: Value, axis: int) -> Value: ...

    def truncate_axis(self, v: Value, axis: int, length: int) -> Value: ...

    def gather_rows(self, table: Value, ids: Sequence[int]) -> Value: ...

    def scatter_into_last_axis(self, dst: Value, src: Value, offset: int) -> Value: ...

    def zeros(self, shape: Sequence[int], dtype: str, residency: str) -> Value: ...

    def argmax_rows(self, x: Value) -> Value: ...

    def distribution_rows(self, scores: Value, sampling: Sampling) -> Value: ...

    def sample_rows(self, probs: Value, uniforms: Sequence[float]) -> Value: ...

    def rejection_sample(self, p: Value, q: Sequence[Value] | None, drafts: Sequence[int],
                         uniforms: Sequence[float]) -> Value: ...

    def adopt(self, v: Value, residency: str) -> Value: ...
