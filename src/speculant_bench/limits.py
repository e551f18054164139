"""The physical limit of greedy decoding on the benchmarked device, measured in the same run.

A greedy step is one target pass, and a pass must at least read every weight once and the
KV cache it attends over. So, per generated token::

    bytes = weight bytes (every target initializer)
          + KV bytes read (Σ over the target's cache cells of one position's bytes × context)

which for a Llama target is ``2 × layers × kv_heads × head_dim × itemsize × context``, taken
at the run's mean context length (mean prompt length + new tokens / 2: the cache a decode
step attends over, averaged over the decode). The limit is ``bandwidth / bytes`` tokens/s,
with the bandwidth measured on the same machine in the same run:

* host: a large numpy copy (2 × 256 MiB buffers, split over the run's thread count), counted
  as bytes read + bytes written per second (the STREAM "copy" convention);
* CUDA: a CuPy device-to-device copy (2 × 1 GiB), counted the same way; and the *launch
  floor*: the time of one ONNX Runtime CUDA run of a one-node graph through IO binding, with
  the providers speculant gives the target. No pass can take less, so a greedy decode cannot
  beat ``1 / floor`` tokens/s however small the model.

Each runner's distance to the limit is its measured decode tokens/s over the bandwidth limit
(``of_physical_limit``). Speculative runners can pass 1.0: a pass commits several tokens.
Nothing here asserts a timing; a measurement that cannot run is reported with its reason.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import onnx

from speculant.package.package import Package
from speculant.tensors.value import NUMPY_DTYPES
from speculant_bench.spread import Spread

HOST_COPY_BYTES = 256 << 20
CUDA_COPY_BYTES = 1 << 30
COPY_WARMUP, COPY_REPEATS = 2, 7
FLOOR_WARMUP, FLOOR_REPEATS = 20, 200


# -- bytes per token ------------------------------------------------------------------------
def tensor_nbytes(tensor: onnx.TensorProto) -> int:
    """Bytes of an initializer from its dims and element type (inline or external data)."""
    itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    return math.prod(tensor.dims) * itemsize


@dataclass(frozen=True)
class TargetBytes:
    """What a target pass reads at least."""

    weight_bytes: int  # every initializer of the target graph
    num_initializers: int
    kv_bytes_per_position: int  # one cached position of every cell the target reads
    num_cells: int

    def kv_bytes(self, context: float) -> float:
        return self.kv_bytes_per_position * context

    def per_token(self, context: float) -> float:
        """Bytes a greedy step moves at cache length ``context``."""
        return self.weight_bytes + self.kv_bytes(context)


def target_bytes(package: Package) -> TargetBytes:
    """From the package: the target graph's initializers (external data counted by shape) and
    its state cells' contracts (one position: every static extent but the sequence axis; a
    symbolic extent, the batch, counts 1)."""
    graph = package.graphs[package.plan.target].graph
    weights = sum(tensor_nbytes(t) for t in graph.initializer)
    per_position = 0
    for cell in package.plan.cells.values():
        itemsize = NUMPY_DTYPES[cell.contract.dtype].itemsize
        extents = [d for axis, d in enumerate(cell.contract.dims)
                   if axis != cell.sequence_axis and isinstance(d, int)]
        per_position += math.prod(extents) * itemsize
    return TargetBytes(weights, len(graph.initializer), per_position, len(package.plan.cells))


def mean_context(prompt_lengths: list[int], new_tokens: float) -> float:
    """Cache length a decode step attends over, averaged over the decode steps and prompts:
    step ``t`` (1 … N−1, after the prefill) attends over ``P + t`` positions, mean
    ``P + N/2``."""
    return float(np.mean(prompt_lengths)) + new_tokens / 2


# -- measurements -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Measured:
    """One measured figure with how it was measured, or why it was not."""

    method: str
    spread: Spread | None = None  # GB/s for bandwidths, ms for the launch floor
    error: str | None = None

    def as_dict(self) -> dict:
        return {"method": self.method,
                "spread": self.spread.as_dict() if self.spread else None,
                "error": self.error}


def host_bandwidth(threads: int | None = 1, nbytes: int = HOST_COPY_BYTES,
                   repeats: int = COPY_REPEATS) -> Measured:
    """GB/s of a numpy copy of ``nbytes`` (read + written), the buffers split in ``threads``
    contiguous chunks copied concurrently (numpy releases the GIL while copying)."""
    workers = max(1, threads or 1)
    method = (f"numpy copy of {nbytes >> 20} MiB on {workers} thread(s), "
              "(bytes read + bytes written) / s")
    source = np.ones(nbytes // 8, dtype=np.float64)
    target = np.zeros_like(source)
    pairs = list(zip(np.array_split(source, workers), np.array_split(target, workers),
                     strict=True))

    def copy_all(pool: ThreadPoolExecutor | None) -> None:
        if pool is None:
            np.copyto(target, source)
        else:
            list(pool.map(lambda pair: np.copyto(pair[1], pair[0]), pairs))

    pool = ThreadPoolExecutor(workers) if workers > 1 else None
    try:
        seconds = _timed(lambda: copy_all(pool), COPY_WARMUP, repeats)
    finally:
        if pool is not None:
            pool.shutdown()
    return Measured(method, Spread.of([2 * nbytes / s / 1e9 for s in seconds]))


def cuda_bandwidth(device: str, nbytes: int = CUDA_COPY_BYTES,
                   repeats: int = COPY_REPEATS) -> Measured:
    """GB/s of a CuPy device-to-device copy of ``nbytes`` (read + written), CUDA events."""
    method = f"CuPy device-to-device copy of {nbytes >> 20} MiB, (bytes read + written) / s"
    try:
        import cupy as cp
    except ImportError as error:
        return Measured(method, error=f"CuPy is not importable: {error}")
    try:
        with cp.cuda.Device(_ordinal(device)):
            source = cp.ones(nbytes // 4, dtype=cp.float32)
            target = cp.empty_like(source)
            values = []
            for repeat in range(COPY_WARMUP + repeats):
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                cp.copyto(target, source)
                end.record()
                end.synchronize()
                if repeat >= COPY_WARMUP:
                    seconds = cp.cuda.get_elapsed_time(start, end) / 1000
                    values.append(2 * nbytes / seconds / 1e9)
            del source, target
            cp.get_default_memory_pool().free_all_blocks()
        return Measured(method, Spread.of(values))
    except Exception as error:  # noqa: BLE001 (a failed measurement is reported, not raised)
        return Measured(method, error=f"{type(error).__name__}: {error}")


def launch_floor_model() -> onnx.ModelProto:
    """One ``Add`` of a 1-element float32 tensor to itself."""
    helper = onnx.helper
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])], "launch_floor",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def cuda_launch_floor(device: str, seam=None, repeats: int = FLOOR_REPEATS) -> Measured:
    """Milliseconds of one ONNX Runtime CUDA run of :func:`launch_floor_model` through IO
    binding (input and output on the device), with the execution-provider options speculant
    gives its sessions on ``seam`` (the engine's stream), timed run by run."""
    method = ("ONNX Runtime CUDA run of a one-node graph (Add of 1 float) through IO "
              "binding, input and output on the device, speculant's provider options")
    try:
        import onnxruntime as ort

        from speculant.session.session import provider_for, session_options

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return Measured(method, error="this onnxruntime has no CUDAExecutionProvider")
        if seam is not None:
            providers = provider_for(device, seam, use_tf32=False)
        else:
            providers = [("CUDAExecutionProvider", {"device_id": str(_ordinal(device))})]
        options = session_options()
        session = ort.InferenceSession(launch_floor_model().SerializeToString(), options,
                                       providers=providers)
        if session.get_providers()[0] != "CUDAExecutionProvider":
            return Measured(method, error=f"ONNX Runtime created {session.get_providers()}")
        ordinal = _ordinal(device)
        x = ort.OrtValue.ortvalue_from_numpy(np.ones(1, np.float32), "cuda", ordinal)
        binding = session.io_binding()
        binding.bind_ortvalue_input("x", x)
        binding.bind_output("y", "cuda", ordinal)

        def run() -> None:
            session.run_with_iobinding(binding)
            binding.synchronize_outputs()

        seconds = _timed(run, FLOOR_WARMUP, repeats)
        return Measured(method, Spread.of([1000 * s for s in seconds]))
    except Exception as error:  # noqa: BLE001 (a failed measurement is reported, not raised)
        return Measured(method, error=f"{type(error).__name__}: {error}")


def _ordinal(device: str) -> int:
    return int(device.split(":")[1]) if ":" in device else 0


def _timed(action: Callable[[], None], warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        action()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - started)
    return seconds


# -- the limit ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PhysicalLimit:
    """What one bench run measured for its limit."""

    device: str  # "cpu" or "cuda:N", as the bench was asked
    bytes: TargetBytes
    mean_context: float
    bandwidth: Measured  # GB/s
    launch_floor: Measured | None  # ms; CUDA only

    @property
    def bytes_per_token(self) -> float:
        return self.bytes.per_token(self.mean_context)

    @property
    def tokens_per_s(self) -> float | None:
        """Bandwidth (median) over bytes per token: the greedy limit."""
        if self.bandwidth.spread is None:
            return None
        return self.bandwidth.spread.median * 1e9 / self.bytes_per_token

    @property
    def floor_tokens_per_s(self) -> float | None:
        """One pass per token cannot beat one launch floor (median) per token."""
        floor = self.launch_floor.spread if self.launch_floor else None
        return None if floor is None else 1000 / floor.median

    def as_dict(self) -> dict:
        b = self.bytes
        return {
            "device": self.device,
            "weight_bytes": b.weight_bytes, "initializers": b.num_initializers,
            "kv_bytes_per_position": b.kv_bytes_per_position, "kv_cells": b.num_cells,
            "mean_context": self.mean_context,
            "kv_bytes_read": b.kv_bytes(self.mean_context),
            "bytes_per_token": self.bytes_per_token,
            "bandwidth_gb_per_s": self.bandwidth.as_dict(),
            "launch_floor_ms": self.launch_floor.as_dict() if self.launch_floor else None,
            "greedy_limit_tokens_per_s": self.tokens_per_s,
            "launch_floor_limit_tokens_per_s": self.floor_tokens_per_s,
        }


def measure(package: Package, device: str, prompt_lengths: list[int], new_tokens: float,
            threads: int | None = None, seam=None) -> PhysicalLimit:
    """Bytes per token of ``package``'s target and the device's bandwidth (and on CUDA its
    launch floor), measured now."""
    device = "cpu" if device in ("cpu", "host") else device
    counted = target_bytes(package)
    context = mean_context(prompt_lengths, new_tokens)
    if device.startswith("cuda"):
        return PhysicalLimit(device, counted, context, cuda_bandwidth(device),
                             cuda_launch_floor(device, seam))
    return PhysicalLimit(device, counted, context, host_bandwidth(threads), None)


# -- the report ------------------------------------------------------------------------------
def annotate(report: dict, limit: PhysicalLimit | None) -> dict:
    """Add ``physical_limit`` to a bench report and ``of_physical_limit`` (decode tokens/s
    median over the greedy limit) to each runner."""
    if limit is None:
        return report
    section = limit.as_dict()
    tokens_per_s = limit.tokens_per_s
    for runner in report["runners"]:
        decode = runner["decode_tokens_per_s"]["median"]
        runner["of_physical_limit"] = decode / tokens_per_s if tokens_per_s else None
    report["physical_limit"] = section
    return report


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.1f} MB" if nbytes < 1e9 else f"{nbytes / 1e9:,.3f} GB"


def markdown(report: dict) -> list[str]:
    """The "Physical limit" section of ``bench.md`` (empty without one)."""
    limit = report.get("physical_limit")
    if limit is None:
        return []
    bandwidth = limit["bandwidth_gb_per_s"]
    lines = ["", "## Physical limit (greedy: one target pass per token)", "",
             f"- bytes per token: {_gb(limit['bytes_per_token'])} = weights "
             f"{_gb(limit['weight_bytes'])} ({limit['initializers']} initializers) + KV read "
             f"{_gb(limit['kv_bytes_read'])} ({limit['kv_cells']} cells × "
             f"{limit['kv_bytes_per_position'] // max(limit['kv_cells'], 1):,} bytes per "
             f"position × mean context {limit['mean_context']:.1f})"]
    if bandwidth["spread"] is not None:
        s = bandwidth["spread"]
        lines.append(f"- bandwidth: {s['median']:.1f} [{s['min']:.1f}–{s['max']:.1f}] GB/s "
                     f"({bandwidth['method']})")
        lines.append(f"- greedy limit: {limit['greedy_limit_tokens_per_s']:,.1f} tokens/s "
                     "(median bandwidth / bytes per token)")
    else:
        lines.append(f"- bandwidth: not measured ({bandwidth['error']})")
    floor = limit["launch_floor_ms"]
    if floor is not None:
        if floor["spread"] is not None:
            s = floor["spread"]
            lines.append(f"- launch floor: {s['median']:.4f} [{s['min']:.4f}–{s['max']:.4f}] "
                         f"ms per ONNX Runtime run ({floor['method']}): at most "
                         f"{limit['launch_floor_limit_tokens_per_s']:,.0f} passes/s")
        else:
            lines.append(f"- launch floor: not measured ({floor['error']})")
    lines += ["", "| runner | decode tok/s | ÷ greedy limit |", "|---|---:|---:|"]
    for runner in report["runners"]:
        ratio = runner.get("of_physical_limit")
        lines.append(f"| {runner['name']} | {runner['decode_tokens_per_s']['median']:,.1f} | "
                     f"{'–' if ratio is None else f'{ratio:.3f}'} |")
    return lines
