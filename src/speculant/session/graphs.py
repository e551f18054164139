"""CUDA graph capture of pass plans (issue 12 item 3): ONNX Runtime's ``enable_cuda_graph``.

**The API, end to end.**

* ``speculant.load(path, device="cuda", cuda_graphs="auto" | True | False)``; the engine
  resolves the setting once (:func:`decide`) and hands each :class:`ComponentSession` a
  :class:`GraphDecision`. ``"auto"`` (the default) is on where the package has static caches
  (a state group with ``update.kind: indexed_scatter``: every pass of one width has one shape)
  and the device is CUDA; ``True`` asks for capture on CUDA whatever the caches (a CPU device
  or host-bound outputs are then a :class:`ResidencyError`); ``False`` is eager.
* A session that wants graphs is created with the CUDA EP option ``enable_cuda_graph=1``. ONNX
  Runtime refuses that session where the graph cannot be captured (a node not placed on CUDA,
  control flow); the session is then created without the option and runs eagerly, and
  :attr:`GraphCapture.describe` says why: ``eager (ONNX Runtime refused capture: ...)``. The
  decode's stats carry it (``DecodeStats.cuda_graphs``), so ``--stats`` shows it: never a
  silent fallback.
* One session serves both kinds of run: its plain ``invoke`` (a prefill of any length, a
  pass of an appended cache) runs with run config ``gpu_graph_id = -1`` (ORT's "do not
  capture"); each :class:`~speculant.session.plan.PassPlan` made on it gets an id of its own
  (:meth:`GraphCapture.new_id`: 0, 1, 2, ...) and runs with that id.
* **A plan per width is a graph per width.** A caller asks for "a plan for width n" the one
  way it always has: ``PassPlan.prepare(session, inputs_of_width_n, shared=...)``. On a
  capturing session the plan is graph-replayed (``plan.graph_id >= 0``); elsewhere (CPU, a
  refused capture, ``cuda_graphs=False``, a plan with a host-bound buffer) it is the same
  plan run eagerly (``plan.graph_id == -1``, ``plan.eager_reason`` says why). The static
  engineer's TargetPass keeps a dict ``{width: PassPlan}`` and needs nothing else.
* ORT's protocol: all inputs and outputs at fixed device addresses (the plan's buffers; new
  values are copied *into* them by ``plan.write``), the first run of a graph id captures (ORT
  runs it for its allocations, captures, then replays once, all inside that one run), later
  runs replay. ORT keeps every captured graph for the session's life and an id is bound to
  the addresses it captured, so ids are never reused: plans (and the buffers they bind) are
  to be made once per engine and width, not per request; a session hands out at most
  :data:`MAX_GRAPHS` ids, after which plans run eagerly and ``describe`` says so. A pass is
  idempotent (the static form writes the same slots ``[L, L + n)`` from
  the same inputs), so ORT's extra runs inside the capture change nothing.

**Counters** (the seam's :class:`~speculant.tensors.backend.ResidencyCounters`, which every
decode's stats snapshot): ``graph_captures`` (first runs of a graph id) and ``graph_replays``
(every later run of one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speculant.errors import ResidencyError
from speculant.tensors import HOST

EAGER_ID = -1  # ORT's gpu_graph_id for "run without capture or replay"
MAX_GRAPHS = 64  # graph ids per session: ORT keeps every captured graph for the session's life
SETTINGS = (True, False, "auto")


@dataclass(frozen=True)
class GraphDecision:
    """Whether a session is to be created for capture, and if not, why."""

    is_wanted: bool
    reason: str = ""  # why not (empty when wanted)


def decide(setting: object, device: str, *, has_static_caches: bool,
           outputs_on_host: bool) -> GraphDecision:
    """The engine's ``cuda_graphs`` option resolved for ``device`` (``host`` or ``cuda:N``)."""
    if setting not in SETTINGS or not isinstance(setting, bool | str):
        raise ResidencyError(f"cuda_graphs must be True, False or 'auto', got {setting!r}",
                             value=setting, remedy="load(..., cuda_graphs='auto')")
    if setting is False:
        return GraphDecision(False, "cuda_graphs=False")
    if device == HOST:
        if setting is True:
            raise ResidencyError("cuda_graphs=True needs a CUDA device; this engine runs on "
                                 "the CPU", value=device,
                                 remedy="load with device='cuda', or cuda_graphs='auto'")
        return GraphDecision(False, "the device is the CPU")
    if outputs_on_host:
        if setting is True:
            raise ResidencyError("cuda_graphs=True cannot capture outputs bound to host memory "
                                 "(outputs_on_host=True)", value=device,
                                 remedy="drop outputs_on_host, or cuda_graphs=False")
        return GraphDecision(False, "outputs are bound to the host (outputs_on_host)")
    if setting == "auto" and not has_static_caches:
        return GraphDecision(False, "the package's caches are appended (a pass's shapes change "
                                    "every round); rebuild it with --cache static")
    return GraphDecision(True)


OFF = GraphDecision(False, "cuda_graphs=False")


@dataclass
class GraphCapture:
    """A session's capture state: enabled or eager with a reason, and the ids it handed out."""

    is_enabled: bool
    reason: str = ""  # why eager
    num_ids: int = 0
    max_ids: int = MAX_GRAPHS
    _options: dict[tuple[int, bool], Any] = field(default_factory=dict, repr=False)

    def describe(self) -> str:
        if not self.is_enabled:
            return f"eager ({self.reason})"
        if self.is_spent:
            return (f"captured per width, replayed; {self.budget_reason} (later plans run "
                    "eagerly)")
        return "captured per width, replayed"

    @property
    def is_spent(self) -> bool:
        return self.num_ids >= self.max_ids

    @property
    def budget_reason(self) -> str:
        return (f"graph budget of {self.max_ids} per session spent (a plan per width should "
                "be made once per engine, not per request)")

    def new_id(self) -> int:
        """A fresh ``gpu_graph_id`` for one plan, never reused within the session (ORT would
        replay the old graph's addresses); :data:`EAGER_ID` once :attr:`max_ids` are out."""
        if self.is_spent:
            return EAGER_ID
        graph_id = self.num_ids
        self.num_ids += 1
        return graph_id

    def run_options(self, graph_id: int, *, unsynchronized: bool = False) -> Any:
        """ORT run options with ``gpu_graph_id`` = ``graph_id`` and, when ``unsynchronized``,
        ``disable_synchronize_execution_providers``: the run returns once its work is queued
        on the stream (captured plans: see PassPlan). None on an eager session (ORT's
        defaults: nothing to say)."""
        if not self.is_enabled:
            return None
        key = (graph_id, unsynchronized)
        options = self._options.get(key)
        if options is None:
            import onnxruntime as ort

            options = ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(graph_id))
            if unsynchronized:
                options.add_run_config_entry("disable_synchronize_execution_providers", "1")
            self._options[key] = options
        return options


def refusal_reason(error: BaseException) -> str:
    """ORT's refusal of a capturing session, in one line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return "ONNX Runtime refused capture: " + (lines[0] if lines else type(error).__name__)
