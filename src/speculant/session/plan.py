"""A pass plan: one component at one fixed set of shapes, its IO binding prepared once.

Made once per width (the first run checks every contract; later runs write only the values
that change and run); a captured plan is a CUDA graph per width. How and why:
docs/design/session.md, "Pass plans".
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence

import numpy as np

from speculant.errors import ContractError, ResidencyError
from speculant.session.binding import bind_input, bind_output, run_bound
from speculant.session.graphs import EAGER_ID
from speculant.session.session import ComponentSession, Invocation
from speculant.tensors import NUMPY_DTYPES, Value

# ONNX Runtime's CUDA EP runs a graph id twice as a regular run before it captures it (its
# third run: ``min_num_runs_before_cuda_graph_capture_ = 2``)
CAPTURE_RUNS = 3


class PassPlan:
    """One component's pass at fixed shapes: owned buffers bound once (see the module)."""

    def __init__(self, session: ComponentSession, inputs: dict[str, Value],
                 outputs: dict[str, Value], *, capture: bool = True) -> None:
        """Bind ``inputs`` and ``outputs`` (owned buffers, fixed from now on) into one IO
        binding. Use :meth:`prepare`, which makes the buffers and checks the contracts.
        ``capture=False``: never a CUDA graph (a plan run once, such as a prefill's)."""
        self.session = session
        self.inputs = inputs  # port -> owned buffer, bound for the plan's life
        self.outputs = outputs  # port -> owned buffer, rewritten by every run
        seam = session.seam
        self.binding = session.session.io_binding()
        for port, buffer in inputs.items():
            bind_input(self.binding, port, buffer, seam.backend(buffer.residency))
        for port, buffer in outputs.items():
            bind_output(self.binding, port, buffer.residency, buffer,
                        seam.backend(buffer.residency))
        self.num_runs = 0
        graphs = session.graphs
        elsewhere = sorted(port for port, buffer in {**inputs, **outputs}.items()
                           if buffer.residency != session.device)
        if not graphs.is_enabled:
            self.graph_id, self.eager_reason = EAGER_ID, graphs.reason
        elif not capture:
            self.graph_id, self.eager_reason = EAGER_ID, "a one-off plan (not captured)"
        elif elsewhere:
            self.graph_id = EAGER_ID
            self.eager_reason = (f"{', '.join(elsewhere)} not in {session.device} memory (a "
                                 "graph captures device addresses only)")
        else:
            self.graph_id = graphs.new_id()
            self.eager_reason = "" if self.graph_id != EAGER_ID else graphs.budget_reason
        # Overlapped: a captured plan (every buffer in device memory, nothing allocated by a
        # replay) returns once its replay is queued; the next read-back on the shared stream
        # waits for it (tensors/cuda.py). Eager runs keep ORT's wait: onnxruntime-gpu 1.31.1
        # aborted an eager unsynchronized run of the fused static graph on the H200.
        self.is_overlapped = (session.overlap and self.graph_id != EAGER_ID and
                              session.seam.backend(session.device).ordering ==
                              "shared_stream")
        self.run_options = graphs.run_options(self.graph_id, unsynchronized=self.is_overlapped)
        self.is_captured = False

    @classmethod
    def prepare(cls, session: ComponentSession, inputs: Mapping[str, Value],
                outputs: Sequence[str] | None = None, *,
                shared: Mapping[str, str] | None = None) -> PassPlan:
        """The plan of ``session`` for the shapes of ``inputs`` (port -> Value, whose contents
        become the buffers' first contents); ``outputs``: the ports to produce (default: all
        the component declares); ``shared``: output port -> the input port whose buffer it is
        written into. Contract violations raise here, as ``invoke`` raises them."""
        produced = session.invoke(inputs, outputs)  # checks every input and output contract
        shared = dict(shared or {})
        for output, source in shared.items():
            cls._check_shared(session, output, source, produced, inputs)
        seam = session.seam
        buffers = {}
        with seam.write_batch():
            for port, value in inputs.items():
                buffer = seam.zeros(value.shape, value.dtype, session.device)
                buffers[port] = cls.copy_into(session, port, buffer, value)
            targets = {port: buffers[shared[port]] if port in shared else
                       seam.zeros(value.shape, value.dtype, session.output_residency)
                       for port, value in produced.items()}
        return cls(session, buffers, targets)

    @staticmethod
    def _check_shared(session: ComponentSession, output: str, source: str,
                      produced: Mapping[str, Value], inputs: Mapping[str, Value]) -> None:
        where = f"pass plan of component '{session.name}'"
        if output not in produced or source not in inputs:
            raise ContractError(
                f"{where}: cannot write output '{output}' into input '{source}': the plan "
                f"produces {sorted(produced)} from {sorted(inputs)}", path=output,
                expected="an output port of the plan and an input port of it")
        got, into = produced[output], inputs[source]
        if got.shape != into.shape or got.dtype != into.dtype:
            raise ContractError(
                f"{where}: output '{output}' is {got.describe()}, input '{source}' is "
                f"{into.describe()}: they cannot share one buffer", path=output,
                value=got.shape, expected=f"{list(into.shape)} {into.dtype} (a "
                "fixed-capacity cache whose present has its past's shape)")

    def write(self, port: str, source: Value | np.ndarray) -> None:
        """Copy ``source`` (a Value, or a host array of the buffer's numpy dtype) into the
        buffer of input ``port``; its shape and dtype must be the buffer's."""
        buffer = self.inputs.get(port)
        if buffer is None:
            raise ContractError(f"pass plan of component '{self.session.name}' has no input "
                                f"'{port}' (it binds {sorted(self.inputs)})", path=port)
        if isinstance(source, Value):
            value, got = source, source.describe()
        else:
            value, got = None, f"a host array {list(source.shape)} {source.dtype}"
            if source.dtype == NUMPY_DTYPES[buffer.dtype]:
                value = Value.host(source, buffer.dtype)
        if value is None or value.shape != buffer.shape or value.dtype != buffer.dtype:
            raise ContractError(
                f"pass plan of component '{self.session.name}': '{port}' was planned as "
                f"{list(buffer.shape)} {buffer.dtype}, got {got}", path=port,
                value=source.shape, expected=f"{list(buffer.shape)} {buffer.dtype} (a plan "
                "of this width; another width needs its own plan)")
        self.copy_into(self.session, port, buffer, value)

    def run(self) -> dict[str, Value]:
        """Run the component on the buffers as they are now; the output buffers, rewritten."""
        session = self.session
        started = time.perf_counter() if session.observers else 0.0
        # observed with its work's time: marks around the replay, asked when read (no wait)
        backend = session.seam.backend(session.device) if session.observers and \
            self.is_overlapped and session.times_to_completion else None
        begin = backend.mark(session.device) if backend is not None else None
        try:
            run_bound(session.session, self.binding, self.run_options)
        except Exception as exc:
            if self.graph_id == EAGER_ID or self.is_captured:
                raise
            raise ResidencyError(
                f"component '{session.name}': ONNX Runtime failed to capture CUDA graph "
                f"{self.graph_id} of a pass plan: {exc}", value=self.graph_id,
                remedy="load with cuda_graphs=False (eager), and report the package") from exc
        self.num_runs += 1
        session.num_invocations += 1
        if self.graph_id != EAGER_ID:
            counters = session.seam.counters
            if self.is_captured:
                counters.graph_replays += 1
            else:
                counters.graph_captures += 1
                self.is_captured = True
        if session.observers:
            end = backend.mark(session.device) if backend is not None else None
            timer = time.perf_counter() - started if backend is None else functools.partial(
                backend.seconds_between, begin, end)
            ready = None if backend is None else functools.partial(backend.is_done, end)
            call = Invocation(session.name, self.inputs, tuple(self.outputs), timer, ready)
            for observer in session.observers:
                observer(call)
        return dict(self.outputs)

    @property
    def awaits_capture(self) -> bool:
        """Whether ONNX Runtime has yet to capture this plan's graph (on its
        :data:`CAPTURE_RUNS`-th run; never for an eager plan)."""
        return self.graph_id != EAGER_ID and self.num_runs < CAPTURE_RUNS

    @staticmethod
    def copy_into(session: ComponentSession, port: str, buffer: Value, value: Value) -> Value:
        """Copy ``value`` into ``buffer`` (same shape and dtype) where the buffer lives."""
        if buffer.size == 0:
            return buffer
        seam = session.seam
        if value.residency != buffer.residency:  # a host value into a device buffer: upload
            value = seam.adopt(value, buffer.residency)
        whole = value if value.rank else Value(value.data.reshape(1), value.residency,
                                               value.dtype)
        target = buffer if buffer.rank else Value(buffer.data.reshape(1), buffer.residency,
                                                  buffer.dtype, owned=True)
        seam.scatter_into_last_axis(target, whole, 0)
        return buffer
