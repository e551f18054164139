"""CUDA graph capture (issue 12 item 3) on the GPU: pass plans captured once per width and
replayed bit for bit as eager runs, ONNX Runtime's refusal of a graph with a CPU node named
and run eagerly, and the engine option end to end.

Run on the GPU machine: ``pytest -m cuda tests/cuda/test_graphs_cuda.py``.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import pytest
from gpu_probe import cuda_marks
from onnx import helper

import speculant
from builders import encode
from builders.writers import write_decoder_package
from export.export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS, write_tokenizer
from speculant.dtypes import dtype_of_onnx
from speculant.errors import ContractError
from speculant.package.model import Ports, TensorContract
from speculant.session.graphs import EAGER_ID, OFF, GraphDecision
from speculant.session.plan import CAPTURE_RUNS, PassPlan
from speculant.session.session import ComponentSession
from speculant.tensors import HOST, Value
from speculant.tensors.devices import make_seam
from speculant_tools.export import write_pair_package

pytestmark = cuda_marks()
DEVICE = "cuda:0"
CAPTURE = GraphDecision(True)


def ports_of(model: onnx.ModelProto) -> Ports:
    """Port contracts read off the graph's own inputs and outputs."""
    def contract(info) -> TensorContract:
        tensor = info.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in
                tensor.shape.dim]
        return TensorContract(dtype=dtype_of_onnx(tensor.elem_type), rank=len(dims),
                              shape=dims)
    return Ports(inputs={i.name: contract(i) for i in model.graph.input},
                 outputs={o.name: contract(o) for o in model.graph.output})


def session_of(model: onnx.ModelProto, decision: GraphDecision, seam=None) -> ComponentSession:
    return ComponentSession("graph", model.SerializeToString(), ports_of(model), DEVICE,
                            seam or make_seam("cuda"), cuda_graphs=decision)


def host_bytes(session: ComponentSession, value: Value) -> bytes:
    return session.seam.adopt(value, HOST).data.tobytes()


# -- a tiny static-shape graph: a cache written in place at an index -----------------------
def scatter_model() -> onnx.ModelProto:
    float_, int64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    graph = helper.make_graph(
        [helper.make_node("ScatterND", ["past", "indices", "updates"], ["present"]),
         helper.make_node("ReduceSum", ["present"], ["total"], keepdims=1)], "cache",
        [helper.make_tensor_value_info("past", float_, [8]),
         helper.make_tensor_value_info("indices", int64, ["n", 1]),
         helper.make_tensor_value_info("updates", float_, ["n"])],
        [helper.make_tensor_value_info("present", float_, [8]),
         helper.make_tensor_value_info("total", float_, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def scatter_inputs(positions: list[int], numbers: list[float]) -> dict[str, Value]:
    return {"past": Value.host(np.zeros(8, np.float32)),
            "indices": Value.host(np.array([[p] for p in positions], np.int64)),
            "updates": Value.host(np.array(numbers, np.float32))}


def test_a_plan_per_width_captures_once_and_replays_the_inputs_written_into_it():
    captured, eager = session_of(scatter_model(), CAPTURE), session_of(scatter_model(), OFF)
    assert captured.graphs.is_enabled, captured.graphs.describe()
    assert not eager.graphs.is_enabled
    runs = [([2], [5.0]), ([4], [7.0]), ([0, 6], [1.0, 3.0]), ([1], [-2.0]), ([3, 5], [4.0, 6.0])]
    results = {}
    for session in (captured, eager):
        plans: dict[int, PassPlan] = {}
        got = []
        for positions, numbers in runs:
            width = len(positions)
            if width not in plans:
                plans[width] = PassPlan.prepare(session, scatter_inputs(positions, numbers),
                                                shared={"present": "past"})
            plan = plans[width]
            plan.write("indices", np.array([[p] for p in positions], np.int64))
            plan.write("updates", np.array(numbers, np.float32))
            outputs = plan.run()
            got.append((host_bytes(session, outputs["present"]),
                        host_bytes(session, outputs["total"])))
        results[session is captured] = got
        ids = sorted(plan.graph_id for plan in plans.values())
        assert ids == ([0, 1] if session is captured else [EAGER_ID, EAGER_ID])
    assert results[True] == results[False]  # replay = eager, bit for bit, run after run
    counters = captured.seam.counters
    assert (counters.graph_captures, counters.graph_replays) == (2, len(runs) - 2)
    assert eager.seam.counters.graph_captures == eager.seam.counters.graph_replays == 0


def test_a_graph_replayed_with_the_wrong_width_is_refused():
    session = session_of(scatter_model(), CAPTURE)
    plan = PassPlan.prepare(session, scatter_inputs([2], [5.0]), shared={"present": "past"})
    plan.run()
    with pytest.raises(ContractError, match="another width needs its own plan"):
        plan.write("indices", np.array([[1], [2]], np.int64))


def test_a_graph_with_a_cpu_only_node_is_refused_and_runs_eagerly_saying_why():
    """ai.onnx.ml's Binarizer has no CUDA kernel: ONNX Runtime places it on the CPU and
    refuses the capturing session; the session runs eagerly and names ORT's refusal."""
    float_ = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Binarizer", ["x"], ["bits"], domain="ai.onnx.ml", threshold=0.5),
         helper.make_node("Add", ["bits", "x"], ["y"])], "mixed",
        [helper.make_tensor_value_info("x", float_, [4])],
        [helper.make_tensor_value_info("y", float_, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                     helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    session = session_of(model, CAPTURE)
    assert not session.graphs.is_enabled
    assert session.graphs.describe().startswith("eager (ONNX Runtime refused capture: ")
    plan = PassPlan.prepare(session, {"x": Value.host(np.array([0.1, 0.7, 0.4, 0.9],
                                                               np.float32))})
    assert plan.graph_id == EAGER_ID and plan.eager_reason.startswith("ONNX Runtime refused")
    y = session.seam.adopt(plan.run()["y"], HOST).data
    assert y.tolist() == pytest.approx([0.1, 1.7, 0.4, 1.9])
    assert session.seam.counters.graph_captures == 0


# -- speculant's exported static target (GroupQueryAttention on shared buffers, float16) ---
@pytest.fixture(scope="module")
def static_pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("graphs-static")
    tokenizer = write_tokenizer(base / "tokenizer.json")
    return {cache: write_pair_package(base / cache, TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS,
                                      tokenizer, dtype="float16", graph="fused", cache=cache)
            for cache in ("appended", "static")}


class PlannedTarget:
    """The static target driven by speculant's session and one PassPlan per width, every
    plan binding the same cell buffers as past and present (docs/design/static-cache.md)."""

    def __init__(self, root, decision: GraphDecision, capacity: int = 48) -> None:
        model = onnx.load(str(root / "target" / "model.onnx"))
        self.session = session_of(model, decision)
        self.seam = self.session.seam
        c = CONFIG
        shape = (1, c.num_key_value_heads, capacity, c.head_dim)
        self.cells = {f"{i}.{part}": self.seam.zeros(shape, "float16", DEVICE)
                      for i in range(c.num_hidden_layers) for part in ("key", "value")}
        self.plans: dict[int, PassPlan] = {}
        self.length = 0

    def plan(self, n: int) -> PassPlan:
        if n not in self.plans:
            seam, c = self.seam, CONFIG
            small = {"input_ids": ([1, n], "int64"), "position_ids": ([1, n], "int64"),
                     "cache_lengths": ([1], "int64")}
            inputs = {port: seam.zeros(shape, dtype, DEVICE) for port, (shape, dtype) in
                      small.items()}
            inputs.update({f"past_key_values.{cell}": buffer
                           for cell, buffer in self.cells.items()})
            outputs = {"logits": seam.zeros([1, n, c.vocab_size], "float16", DEVICE),
                       "hidden_states": seam.zeros([1, n, c.hidden_size], "float16", DEVICE)}
            outputs.update({f"present.{cell}": buffer for cell, buffer in self.cells.items()})
            self.plans[n] = PassPlan(self.session, inputs, outputs)
        return self.plans[n]

    def run(self, ids: list[int]) -> bytes:
        n, start = len(ids), self.length
        plan = self.plan(n)
        plan.write("input_ids", np.array([ids], np.int64))
        plan.write("position_ids", np.arange(start, start + n, dtype=np.int64)[None])
        plan.write("cache_lengths", np.array([start], np.int64))
        logits = plan.run()["logits"]
        self.length = start + n
        return host_bytes(self.session, logits)


def drive(target: PlannedTarget) -> list[bytes]:
    """A greedy prefix, a 4-wide verify, a rollback by length, then width-1 steps."""
    logits = [target.run([3, 17, 8, 22])]
    token = int(np.frombuffer(logits[-1], np.float16).reshape(4, -1)[-1].argmax())
    for _ in range(8):
        logits.append(target.run([token]))
        token = int(np.frombuffer(logits[-1], np.float16).argmax())
    logits.append(target.run([token, 5, 9, 11]))  # a verify over 3 drafts
    target.length -= 2  # keep 2 of the 4: the rollback is the length
    for _ in range(6):
        logits.append(target.run([token]))
        token = int(np.frombuffer(logits[-1], np.float16).argmax())
    return logits


def test_the_static_target_replayed_per_width_equals_its_eager_plans(static_pair):
    captured = PlannedTarget(static_pair["static"], CAPTURE)
    assert captured.session.graphs.is_enabled, captured.session.graphs.describe()
    eager = PlannedTarget(static_pair["static"], OFF)
    assert drive(captured) == drive(eager)  # bit for bit: the same kernels, replayed
    counters = captured.seam.counters
    assert sorted(p.graph_id for p in captured.plans.values()) == [0, 1]  # widths 4 and 1
    assert counters.graph_captures == 2
    assert counters.graph_replays == 1 + 8 + 1 + 6 - 2


# -- the engine option ----------------------------------------------------------------------
def test_auto_is_eager_on_appended_caches_and_says_why(tmp_path):
    engine = speculant.load(write_decoder_package(tmp_path / "d", dtype="float16"),
                            device="cuda")
    assert engine.cuda_graphs.startswith("decoder: eager (the package's caches are appended")
    result = engine.generate(encode("def "), 8)
    assert result.stats.cuda_graphs == engine.cuda_graphs
    assert result.stats.residency["graph_captures"] == 0


def test_a_capturing_session_runs_invoke_eagerly_with_the_same_tokens(tmp_path):
    """cuda_graphs=True on an appended package: the sessions are created for capture, and
    every invoke runs with gpu_graph_id = -1 (eager), token for token as a plain session."""
    root = write_decoder_package(tmp_path / "d", dtype="float16")
    plain = speculant.load(root, device="cuda", cuda_graphs=False)
    forced = speculant.load(root, device="cuda", cuda_graphs=True)
    assert forced.cuda_graphs == "decoder: captured per width, replayed"
    expected = plain.generate(encode("def "), 24, stop_on_eos=False)
    got = forced.generate(encode("def "), 24, stop_on_eos=False)
    assert got.token_ids == expected.token_ids
    assert got.stats.residency["graph_captures"] == got.stats.residency["graph_replays"] == 0


STATIC_RUNTIME = importlib.util.find_spec("speculant.workflow.cells") is not None


@pytest.mark.skipif(not STATIC_RUNTIME, reason="needs the static-cache runtime (branch "
                                                "'static': workflow/cells.py)")
@pytest.mark.parametrize("k", ["auto", 1, 4])
def test_the_static_pair_on_cuda_replays_graphs_and_decodes_greedy(static_pair, k):
    appended = speculant.load(static_pair["appended"], device="cuda")
    engine = speculant.load(static_pair["static"], device="cuda")  # cuda_graphs="auto"
    assert engine.cuda_graphs.startswith("target: captured per width, replayed")
    prompt = [3, 17, 8, 22, 5]
    greedy = appended.generate(prompt, 40, stop_on_eos=False)
    result = engine.generate(prompt, 40, speculative=True, k=k, stop_on_eos=False)
    assert result.token_ids == greedy.token_ids
    assert result.stats.residency["graph_captures"] >= 1
    assert result.stats.residency["graph_replays"] > 0


@pytest.mark.skipif(not STATIC_RUNTIME, reason="needs the static-cache runtime (branch "
                                                "'static': workflow/cells.py)")
def test_graph_ids_do_not_grow_with_requests(static_pair):
    """ORT keeps every captured graph for the session's life: plans per width must be made
    once per engine, so a second and third request capture nothing new."""
    engine = speculant.load(static_pair["static"], device="cuda")
    target = engine.sessions[engine.package.plan.target]
    engine.generate([3, 17, 8], 16, speculative=True, k=4, stop_on_eos=False)
    ids_after_one = target.graphs.num_ids
    for _ in range(2):
        engine.generate([3, 17, 8], 16, speculative=True, k=4, stop_on_eos=False)
    assert target.graphs.num_ids == ids_after_one


@pytest.mark.parametrize("earlier_k", [None, 2])
def test_auto_k_captures_every_width_before_its_first_round(static_pair, earlier_k):
    """k="auto" picks its width round to round; a width first captured mid-decode stalled
    it. Before the first round every target width 1 … K + 1 and every unrolled chain depth
    is captured, so a later request captures nothing, whichever widths it picks. With
    ``earlier_k`` a request at a fixed k left plans made but not captured, their inputs from
    a shorter prompt: they are run from this request's start (tokens stay greedy's)."""
    appended = speculant.load(static_pair["appended"], device="cuda")
    engine = speculant.load(static_pair["static"], device="cuda")
    if earlier_k:
        engine.generate([3, 17], 2, speculative=True, k=earlier_k, stop_on_eos=False)
    prompt = [3, 17, 8, 22, 5, 9, 11, 4, 6, 7, 12]
    greedy = appended.generate(prompt, 40, stop_on_eos=False)
    first = engine.generate(prompt, 40, speculative=True, k="auto", stop_on_eos=False)
    assert first.token_ids == greedy.token_ids
    max_k = engine.proposer_sources.chained.max_k  # the widest k=auto may pick
    cells, = engine.static_pool._cells.values()
    assert sorted(cells.plans) == list(range(1, max_k + 2))
    assert all(plan.num_runs >= CAPTURE_RUNS for plan in cells.plans.values())
    chains = cells.chain_steps.chains
    assert sorted(chains) == list(range(2, max_k + 2))
    assert all(not plan.awaits_capture for plan in chains.values())
    second = engine.generate(prompt[3:], 40, speculative=True, k="auto", stop_on_eos=False)
    assert second.token_ids == appended.generate(prompt[3:], 40, stop_on_eos=False).token_ids
    moved = {name: second.stats.residency[name] - first.stats.residency[name]
             for name in ("graph_captures", "graph_replays")}  # the engine's counters
    assert moved["graph_captures"] == 0 and moved["graph_replays"] > 0


def test_the_draft_models_passes_are_captured_and_its_tokens_are_greedys(tmp_path):
    """A static draft package beside a static target: the draft's passes are captured per
    width and replayed (its own plans), and its speculation decodes greedy's tokens."""
    from pathlib import Path

    from speculant_tools.export import convert

    here = Path(speculant.__file__).parent
    target = convert(str(here / "demo"), tmp_path / "target", "float16", cache="static")
    draft = convert(str(here / "demo_draft"), tmp_path / "draft", "float16", cache="static")
    engine = speculant.load(target, device="cuda", draft=draft)
    assert "draft: captured per width, replayed" in engine.cuda_graphs, engine.cuda_graphs
    prompt = engine.tokenizer.encode("def fibonacci(n):\n")
    greedy = engine.generate(prompt, 48, stop_on_eos=False)
    result = engine.generate(prompt, 48, stop_on_eos=False, proposer="draft", k=4)
    assert result.token_ids == greedy.token_ids
    plans = [plan for cells in engine.draft.static_pool._cells.values()
             for plan in cells.plans.values()]
    assert any(plan.graph_id != EAGER_ID and plan.num_runs > 1 for plan in plans)
