"""One ONNX Runtime session per component, run by IO binding (docs/design/spec/residency.md §6).

`ComponentSession.invoke` is the one seam every component run goes through: it checks the
inputs against the port contracts (a fresh invocation-scope symbol table), binds them where
they live (`session/binding.py`), runs, adopts the outputs as `Value`s on the execution device,
and checks those. A caller that has already checked the values at package scope passes
``check=False`` (contracts are checked once per pass).

**Observers.** ``session.observers`` is a list of callables; after every invocation each gets
one :class:`Invocation` (the component, the inputs bound, the outputs asked for, and the
seconds the invocation took: binding, ORT's run and adopting the outputs). With no observer
nothing is timed. The bench measures through it (``speculant_bench/timing.py``):

    session.observers.append(lambda call: durations.append(call.seconds))

**CUDA graphs** (``session/graphs.py``): ``cuda_graphs=GraphDecision(True)`` creates the
session with the CUDA EP option ``enable_cuda_graph=1`` (or, where ONNX Runtime refuses it,
without, and ``session.graphs`` says why); ``invoke`` then runs with ``gpu_graph_id = -1``
(eager) and every :class:`~speculant.session.plan.PassPlan` made on the session captures and
replays a graph of its own.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

try:
    import onnxruntime as ort
except ImportError:  # neither flavour installed: refused with a typed error at load
    ort = None

from speculant.dtypes import dtype_of_ort
from speculant.errors import INSTALL_CUDA, AdmissionError, ContractError, ResidencyError
from speculant.package.model import Ports
from speculant.session.binding import (
    adopt_output,
    bind_input,
    bind_output,
    raw_binding,
    run_bound,
    stream_provider_options,
)
from speculant.session.contracts import SymbolTable
from speculant.session.graphs import EAGER_ID, OFF, GraphCapture, GraphDecision, refusal_reason
from speculant.session.pools import ProcessPool
from speculant.tensors import HOST, Residency, TensorSeam, Value


@dataclass(frozen=True)
class Invocation:
    """One finished ``invoke``, as its observers see it."""

    component: str  # the session's name
    inputs: Mapping[str, Value]  # port -> the value bound
    outputs: tuple[str, ...]  # the output ports asked for
    timer: float | Callable[[], float]  # its seconds, or how to ask them (PassPlan.run)
    # whether asking a timer would not wait now (None: it never waits)
    ready: Callable[[], bool] | None = None

    @property
    def seconds(self) -> float:
        """Binding, ORT's run and adopting the outputs (perf_counter); an overlapped replay's
        from marks around it on the stream (asking waits for its end)."""
        return self.timer() if callable(self.timer) else self.timer


Observer = Callable[[Invocation], None]
# ONNX Runtime's default logger (the process's, not a session's) at ERROR while CUDA sessions
# are made: from 1.26 it warns "No registered plugin EP device found for
# 'CUDAExecutionProvider' with device_id=N" on each (it looks for a plugin EP before its own
# CUDA provider). Its useful warning, why the CUDA provider did not load, is printed again
# at WARNING when that happens (ComponentSession), before the ResidencyError.
DEFAULT_LOGGER_SEVERITY, WARNING = 3, 2
# the process's CPU intra-op pool, made once by the first CPU session that can share it
PROCESS_POOL = ProcessPool(lambda intra, inter: ort.set_global_thread_pool_sizes(intra, inter))


def share_cpu_pool() -> None:
    """Let speculant's CPU sessions share one process-wide ONNX Runtime pool (session/pools.py):
    for a process speculant owns; every ONNX Runtime session made in it afterwards must then
    set ``use_per_session_threads = False`` (ONNX Runtime's rule), as :func:`session_options`
    does."""
    PROCESS_POOL.allow()


def session_options() -> ort.SessionOptions:
    """Options for an ONNX Runtime session: on the process's pool once it exists, and its own
    logger silent below FATAL: every error it would log ends in an exception that speculant
    reports itself (an ``AdmissionError`` at creation, with ORT's text), and its warnings are
    advice on graph optimizations. ORT's default logger (a provider library that fails to
    load, for one) keeps its own level."""
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.use_per_session_threads = not PROCESS_POOL.exists
    return options


def provider_for(device: str, seam: TensorSeam, *, use_tf32: bool) -> list:
    """The execution provider list for ``device`` ("host" or "cuda:N"); never a fallback."""
    if ort is None:
        raise ResidencyError(
            "ONNX Runtime is not installed", value=device,
            remedy="install one flavour: pip install 'speculant[cpu]' (onnxruntime) or "
            f"{INSTALL_CUDA} (onnxruntime-gpu and CuPy)")
    available = ort.get_available_providers()
    if device == HOST:
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in available:
        raise ResidencyError(
            f"device '{device}' needs ONNX Runtime's CUDAExecutionProvider, but this onnxruntime "
            f"build offers only {available}", value=device,
            remedy=f"install the GPU build: {INSTALL_CUDA} (which installs "
            "onnxruntime-gpu instead of onnxruntime), or load with device='cpu'")
    ort.set_default_logger_severity(DEFAULT_LOGGER_SEVERITY)
    if hasattr(ort, "preload_dlls"):  # CUDA and cuDNN from the nvidia wheels, once
        ort.preload_dlls()
    residency = Residency.parse(device)
    options = {"device_id": str(residency.ordinal), "use_tf32": "1" if use_tf32 else "0"}
    options.update(stream_provider_options(seam.backend(str(residency)), str(residency)))
    return [("CUDAExecutionProvider", options)]


def _remedy_for(message: str, device: str) -> str:
    """What to do when ORT refuses a graph, where the cause is known."""
    if "GroupQueryAttention" in message and device != HOST:
        return ("ONNX Runtime's CUDA GroupQueryAttention takes float16 and bfloat16 only: a "
                "float32 package exported with graph 'fused' runs on the CPU; for CUDA rebuild "
                "it with `speculant convert PACKAGE OUT --dtype float16` (or --graph explicit)")
    return ""


class ComponentSession:
    """A component's ORT session, its port contracts and its execution device."""

    def __init__(self, name: str, source: str | bytes, ports: Ports, device: str,
                 seam: TensorSeam, *, use_tf32: bool = False, outputs_on_host: bool = False,
                 artifact: str = "", threads: int | None = None,
                 cuda_graphs: GraphDecision = OFF, overlap: bool = True) -> None:
        """``threads``: ONNX Runtime's intra-op thread count (None: its default);
        ``cuda_graphs``: whether to create the session for CUDA graph capture; ``overlap``:
        whether captured pass plans return once queued (session/plan.py)."""
        self.name = name
        self.ports = ports
        self.device = device  # where the component executes
        # where its outputs are bound: the execution device, or the host when asked for
        self.output_residency = HOST if outputs_on_host else device
        self.seam = seam
        self.observers: list[Observer] = []
        # captured pass plans return once their replay is queued (``overlap``); where
        # ``times_to_completion`` (the target's: its observers time verify passes), an
        # overlapped observed run is timed by marks around it, asked when read (no wait)
        self.overlap = overlap
        self.times_to_completion = False
        providers = provider_for(device, seam, use_tf32=use_tf32)
        # the process's one CPU pool where allowed (session/pools.py); else its own, spinning
        # within a run alone: one spinning after its run starves the next session's pool
        self.pool = PROCESS_POOL.decide(threads) if device == HOST else None
        options = session_options()  # the pool's once it exists: ORT refuses CUDA's own too
        if threads is not None and not PROCESS_POOL.exists:
            options.intra_op_num_threads = threads
        if device == HOST and not PROCESS_POOL.exists:
            options.add_session_config_entry("session.force_spinning_stop", "1")
        self.graphs = GraphCapture(False, cuda_graphs.reason)
        if cuda_graphs.is_wanted:
            if device == HOST:
                raise ResidencyError(f"component '{name}': CUDA graphs need a CUDA device",
                                     value=device, remedy="cuda_graphs=False on the CPU")
            provider, provider_options = providers[0]
            capturing = [(provider, {**provider_options, "enable_cuda_graph": "1"})]
            try:
                self.session = ort.InferenceSession(source, options, providers=capturing)
                self.graphs = GraphCapture(True)
            except Exception as exc:  # noqa: BLE001 - ORT's refusal: eager, and say why
                self.graphs = GraphCapture(False, refusal_reason(exc))
        if not self.graphs.is_enabled:
            try:
                self.session = ort.InferenceSession(source, options, providers=providers)
            except Exception as exc:  # ORT raises its own exception types; wrap them (A9)
                raise AdmissionError(
                    f"ONNX Runtime refused to create the session of component '{name}': {exc}",
                    file=artifact, path=f"pipeline.workflow.components.{name}",
                    remedy=_remedy_for(str(exc), device)) from exc
        self.eager_run_options = self.graphs.run_options(EAGER_ID)  # None unless capturing
        wanted = providers[0] if isinstance(providers[0], str) else providers[0][0]
        if self.session.get_providers()[0] != wanted:
            if device != HOST:  # ORT's reason is a warning of its default logger: print it
                ort.set_default_logger_severity(WARNING)
                ort.InferenceSession(source, options, providers=providers)
            raise ResidencyError(
                f"component '{name}' asked for {wanted} but ONNX Runtime created "
                f"{self.session.get_providers()}", value=device,
                remedy="check the CUDA and cuDNN libraries (onnxruntime.preload_dlls()), or "
                "load with device='cpu'")
        self.backend = seam.backend(device)  # the execution device's
        self.output_backend = seam.backend(self.output_residency)
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.output_dtypes = {o.name: dtype_of_ort(o.type) or o.type
                              for o in self.session.get_outputs()}
        self.num_invocations = 0

    @property
    def provider_options(self) -> dict:
        return self.session.get_provider_options()

    def invoke(self, inputs: Mapping[str, Value], outputs: Sequence[str] | None = None, *,
               check: bool = True) -> dict[str, Value]:
        """Run the component on ``inputs`` (port -> Value); return the requested outputs.

        ``check=False``: the caller has checked ``inputs`` against their contracts already
        (a pass checks its values at package scope) and the ports are the component's; the
        invocation-scope checks of inputs and outputs are skipped.
        """
        started = time.perf_counter() if self.observers else 0.0
        symbols = SymbolTable(f"invocation of component '{self.name}'") if check else None
        if symbols is not None:
            for port, value in inputs.items():
                contract = self.ports.inputs.get(port)
                if contract is None:
                    raise ContractError(f"component '{self.name}' has no input port '{port}'",
                                        path=port)
                symbols.check(port, contract, value)
        wanted = list(outputs or [p for p in self.ports.outputs if p in self.output_names])
        binding = self.bind(inputs, wanted)
        # ORT's run waits for the device before it returns. Skipping that wait (run config
        # "disable_synchronize_execution_providers") would let the host prepare the next step
        # while the device computes, but onnxruntime-gpu 1.31.1 then aborts the process when
        # it frees the pinned staging memory of host-bound inputs ("cudaFreeHost: operation
        # not permitted", seen on the H200); so every run keeps ORT's default.
        run_bound(self.session, binding, self.eager_run_options)
        self.num_invocations += 1
        # the C-level OrtValues (the Python wrapper would re-wrap each one)
        produced = dict(zip(wanted, raw_binding(binding).get_outputs(), strict=True))
        residency, backend, dtypes = self.output_residency, self.output_backend, self.output_dtypes
        result = {port: adopt_output(ort_value, residency, backend, dtypes[port])
                  for port, ort_value in produced.items()}
        if symbols is not None:
            for port, value in result.items():
                symbols.check(port, self.ports.outputs[port], value)
        if self.observers:
            call = Invocation(self.name, inputs, tuple(wanted), time.perf_counter() - started)
            for observer in self.observers:
                observer(call)
        return result

    @contextlib.contextmanager
    def unobserved(self) -> Iterator[None]:
        """Runs inside are not told to the observers (a plan made and captured ahead of its
        use: its runs are no measurement of a pass)."""
        observers, self.observers = self.observers, []
        try:
            yield
        finally:
            self.observers = observers

    # -- binding --------------------------------------------------------------------------
    def bind(self, inputs: Mapping[str, Value], outputs: Sequence[str]) -> ort.IOBinding:
        """An IO binding of ``inputs`` where they live and ``outputs`` to the output
        residency (unchecked: :meth:`invoke` checks the contracts first)."""
        binding = self.session.io_binding()
        for port, value in inputs.items():
            if value.residency != HOST and value.residency != self.device:
                raise ResidencyError(
                    f"input '{port}' of component '{self.name}' is {value.describe()}, but the "
                    f"component executes on {self.device}",
                    remedy=f"adopt the value into {self.device} first, or run the component on "
                    f"{value.residency}")
            bind_input(binding, port, value, self.backend)
        for port in outputs:
            bind_output(binding, port, self.output_residency)
        return binding
