"""CUDA graph capture, what the CPU can check: the engine option and its resolution, the
eager plan and the reason it carries, and the bookkeeping of graph ids, captures and replays
(a CPU session told it captures: ONNX Runtime's CPU provider ignores ``gpu_graph_id``, so the
plan's counting and run options are checked without a GPU). Capture itself: tests/cuda."""

from __future__ import annotations

import numpy as np
import pytest
from test_plan import scatter_session

import speculant
from builders import encode
from builders.writers import write_chained_package, write_decoder_package
from speculant.errors import ResidencyError
from speculant.session.graphs import EAGER_ID, GraphCapture, GraphDecision, decide
from speculant.session.plan import PassPlan
from speculant.session.session import ComponentSession
from speculant.tensors import HOST, Value

CPU_REASON = "the device is the CPU"


def first_pass(position: int = 2, number: float = 5.0) -> dict[str, Value]:
    return {"past": Value.host(np.zeros(8, np.float32)),
            "indices": Value.host(np.array([[position]], np.int64)),
            "updates": Value.host(np.array([number], np.float32))}


@pytest.mark.parametrize(("setting", "device", "is_static", "on_host", "expected"), [
    ("auto", "cuda:0", True, False, GraphDecision(True)),
    (True, "cuda:0", False, False, GraphDecision(True)),
    ("auto", "cuda:0", False, False, "appended"),
    ("auto", HOST, True, False, CPU_REASON),
    ("auto", "cuda:0", True, True, "outputs_on_host"),
    (False, "cuda:0", True, False, "cuda_graphs=False"),
])
def test_the_setting_resolves_per_device_and_cache_form(setting, device, is_static, on_host,
                                                        expected):
    decision = decide(setting, device, has_static_caches=is_static, outputs_on_host=on_host)
    if isinstance(expected, GraphDecision):
        assert decision == expected
    else:
        assert not decision.is_wanted and expected in decision.reason


@pytest.mark.parametrize(("setting", "device", "on_host", "message"), [
    (True, HOST, False, "needs a CUDA device"),
    (True, "cuda:0", True, "outputs bound to host memory"),
    ("yes", "cuda:0", False, "True, False or 'auto'"),
    (1, "cuda:0", False, "True, False or 'auto'"),
])
def test_an_impossible_setting_is_a_residency_error(setting, device, on_host, message):
    with pytest.raises(ResidencyError, match=message):
        decide(setting, device, has_static_caches=True, outputs_on_host=on_host)


def test_load_takes_the_option_and_the_stats_say_eager_and_why(tmp_path):
    root = write_chained_package(tmp_path / "pair")
    with pytest.raises(ResidencyError, match="needs a CUDA device"):
        speculant.load(root, cuda_graphs=True)
    with pytest.raises(ResidencyError, match="'auto'"):
        speculant.load(root, cuda_graphs="on")
    engine = speculant.load(root)  # default "auto": eager on the CPU, and it says so
    assert engine.cuda_graphs == f"target: eager ({CPU_REASON}); assistant: eager ({CPU_REASON})"
    result = engine.generate(encode("def "), 8, speculative=True)
    assert result.stats.cuda_graphs == engine.cuda_graphs
    assert result.stats.residency["graph_captures"] == result.stats.residency[
        "graph_replays"] == 0
    off = speculant.load(root, cuda_graphs=False)
    assert off.cuda_graphs == "target: eager (cuda_graphs=False); assistant: eager " \
                              "(cuda_graphs=False)"


def test_the_draft_models_session_says_what_it_does_too(tmp_path):
    """A draft model beside the target gets the engine's graph decision for its own package
    and its line in ``cuda_graphs`` (eager on the CPU, and why)."""
    target = write_decoder_package(tmp_path / "target")
    draft = write_decoder_package(tmp_path / "draft", deviation_positions={3, 9})
    engine = speculant.load(target, draft=draft)
    assert engine.cuda_graphs == f"decoder: eager ({CPU_REASON}); draft: eager ({CPU_REASON})"
    result = engine.generate(encode("def "), 12, proposer="draft", k=2, stop_on_eos=False)
    assert result.stats.cuda_graphs == engine.cuda_graphs


def test_a_capturing_session_on_the_cpu_is_refused(tmp_path):
    engine = speculant.load(write_decoder_package(tmp_path / "decoder"))
    session = engine.sessions[engine.package.plan.target]
    with pytest.raises(ResidencyError, match="CUDA graphs need a CUDA device"):
        ComponentSession("again", engine.package.model_source(session.name), session.ports,
                         HOST, engine.seam, cuda_graphs=GraphDecision(True))


def test_an_eager_plan_says_why_and_counts_nothing():
    session = scatter_session()
    plan = PassPlan.prepare(session, first_pass(), shared={"present": "past"})
    assert plan.graph_id == EAGER_ID and plan.eager_reason == "cuda_graphs=False"
    assert plan.run_options is None and session.eager_run_options is None
    plan.run()
    plan.run()
    counters = session.seam.counters
    assert counters.graph_captures == counters.graph_replays == 0


def capturing(session: ComponentSession, **budget) -> ComponentSession:
    """``session`` told it captures (its runs then carry gpu_graph_id, which the CPU
    provider ignores): the plan's bookkeeping without a GPU."""
    session.graphs = GraphCapture(True, **budget)
    session.eager_run_options = session.graphs.run_options(EAGER_ID)
    return session


def test_each_plan_gets_its_own_graph_id_first_run_captures_later_runs_replay():
    session = capturing(scatter_session())
    one = PassPlan.prepare(session, first_pass(2, 5.0), shared={"present": "past"})
    two = PassPlan.prepare(session, first_pass(4, 7.0), shared={"present": "past"})
    assert (one.graph_id, two.graph_id) == (0, 1)
    assert one.run_options.get_run_config_entry("gpu_graph_id") == "0"
    assert two.run_options.get_run_config_entry("gpu_graph_id") == "1"
    assert session.eager_run_options.get_run_config_entry("gpu_graph_id") == "-1"
    counters = session.seam.counters
    for _ in range(3):
        one.run()
    assert (counters.graph_captures, counters.graph_replays) == (1, 2)
    two.run()
    assert (counters.graph_captures, counters.graph_replays) == (2, 2)
    # the planned runs still compute the pass: new values written into the fixed buffers
    one.write("indices", np.array([[6]], np.int64))
    one.write("updates", np.array([3.0], np.float32))
    assert one.run()["present"].data.tolist() == [0, 0, 5, 0, 0, 0, 3, 0]
    assert (counters.graph_captures, counters.graph_replays) == (2, 3)
    assert session.invoke(first_pass())["present"].data.tolist() == [0, 0, 5, 0, 0, 0, 0, 0]


def test_a_spent_graph_budget_makes_later_plans_eager_and_says_so():
    session = capturing(scatter_session(), max_ids=1)
    first = PassPlan.prepare(session, first_pass(), shared={"present": "past"})
    later = PassPlan.prepare(session, first_pass(), shared={"present": "past"})
    assert first.graph_id == 0 and later.graph_id == EAGER_ID
    assert "graph budget of 1 per session spent" in later.eager_reason
    assert "later plans run eagerly" in session.graphs.describe()
    later.run()
    assert session.seam.counters.graph_captures == session.seam.counters.graph_replays == 0


def test_a_buffer_off_the_device_keeps_a_plan_eager():
    """On a device session a plan with a host buffer cannot be captured: eager, named. (A
    CPU session pretending to execute on cuda:0 sees its host buffers as off-device.)"""
    session = capturing(scatter_session())
    plan = PassPlan.prepare(session, first_pass(), shared={"present": "past"})
    session.device = "cuda:0"
    pretend = PassPlan(session, dict(plan.inputs), dict(plan.outputs))
    assert pretend.graph_id == EAGER_ID
    assert pretend.eager_reason.startswith("indices, past, present, updates not in cuda:0")
