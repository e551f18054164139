"""CUDA graph capture of pass plans: ONNX Runtime's ``enable_cuda_graph``, decided once
per engine (:func:`decide`), a graph id per plan, never reused; a refused capture runs
eagerly and says why (docs/design/session.md, "CUDA graphs").
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
