"""The chain unrolled into one graph (speculative/chain_graph.py's ``chain_component``): on a
device a greedy proposal of width k on static caches is one run of the step graph repeated
k + 1 times, wired as chain_steps.py binds the step plans. Driven here on the CPU (where the
engine keeps the step plans) by handing the proposer the engine's factory: the same drafts as
step by step (so the same acceptance trace), greedy's tokens, one run per proposal; a step
fed the wrong token fails; a graph with a subgraph keeps the step plans."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

import speculant
from export.export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS, write_tokenizer
from speculant.package.model import Ports
from speculant.speculative import chain_graph
from speculant.speculative.chain_graph import DRAFTS, NEXT64, TOKEN, TOKENS, StepComponent
from speculant_tools.export import write_pair_package

PROMPT = [3, 17, 8, 22, 5, 3, 17, 8]
NEW = 40


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    base = tmp_path_factory.mktemp("unrolled")
    tokenizer = write_tokenizer(base / "tokenizer.json")
    return {(dtype, cache): write_pair_package(base / f"{dtype}-{cache}", TARGET_WEIGHTS, CONFIG,
                                               DRAFTER_WEIGHTS, tokenizer, dtype=dtype,
                                               graph="fused", cache=cache)
            for dtype in ("float32", "float16") for cache in ("appended", "static")}


def proposed(engine, monkeypatch) -> list[list[int]]:
    """Every proposal's drafts, read where they were made, as the decode goes."""
    drafts: list[list[int]] = []
    propose = engine.proposer.propose

    def recording(state, k):
        proposal = propose(state, k)
        drafts.append(proposal.drafts.data.tolist())  # the host: the buffer itself
        return proposal

    monkeypatch.setattr(engine.proposer, "propose", recording)
    return drafts


def unrolled_engine(root):
    engine = speculant.load(root, threads=1)
    assert engine.proposer.chain_session is None  # the host keeps the step plans
    engine.proposer.chain_session = engine.chain_session
    return engine


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_one_run_per_proposal_drafts_what_the_steps_draft(packages, dtype, k, monkeypatch):
    greedy = speculant.load(packages[dtype, "appended"], threads=1).generate(
        PROMPT, NEW, stop_on_eos=False).token_ids
    reference = speculant.load(packages[dtype, "static"], threads=1)
    want = proposed(reference, monkeypatch)
    stepwise = reference.generate(PROMPT, NEW, speculative=True, k=k, stop_on_eos=False)
    engine = unrolled_engine(packages[dtype, "static"])
    got = proposed(engine, monkeypatch)
    step_session = engine.sessions[engine.package.plan.proposer]
    calls = []
    step_session.observers.append(calls.append)
    result = engine.generate(PROMPT, NEW, speculative=True, k=k, stop_on_eos=False)
    assert result.token_ids == greedy == stepwise.token_ids
    assert got == want and len(got) == result.stats.rounds > 0  # every draft, every round
    assert result.stats.trace == stepwise.stats.trace
    chains = engine.proposer._chain_sessions
    assert sum(s.num_invocations for s in chains.values()) == result.stats.rounds
    assert step_session.num_invocations == 1  # its checked run, when the plans were made
    # every unrolled run reported to the step session's observers, under its own name
    name = engine.package.plan.proposer
    assert [call.component for call in calls].count(name) == 1
    ran = {call.component for call in calls}
    assert name in ran and ran <= {name, *(f"{name}.chain{d}" for d in chains)}
    # every depth's session was made with the first unrolled proposal, none mid-decode
    assert sorted(chains) == list(range(2, engine.proposer.max_k + 2))


def test_a_step_fed_the_bootstrap_token_again_is_caught(packages, monkeypatch):
    """Planted: step 2 reads p (TOKENS[1]) instead of step 1's draft."""
    make = chain_graph.chain_component

    def miswired(step, depth, carry_output):
        made = make(step, depth, carry_output)
        model = onnx.load_from_string(made.source)
        wrong = f"speculant.chain.s1/{NEXT64}"
        for node in model.graph.node:
            if node.name.startswith("speculant.chain.s2/") or node.name == "" and any(
                    name.startswith("speculant.chain.s2/") for name in node.output):
                node.input[:] = ["speculant.chain.token1" if name == wrong else name
                                 for name in node.input]
        return StepComponent(model.SerializeToString(), made.ports)

    reference = speculant.load(packages["float32", "static"], threads=1)
    want = proposed(reference, monkeypatch)
    reference.generate(PROMPT, NEW, speculative=True, k=4, stop_on_eos=False)
    monkeypatch.setattr("speculant.engine.chain_component", miswired)
    engine = unrolled_engine(packages["float32", "static"])
    got = proposed(engine, monkeypatch)
    planted = engine.generate(PROMPT, NEW, speculative=True, k=4, stop_on_eos=False)
    assert planted.token_ids  # verification still commits greedy's tokens
    assert [d[:1] for d in got] == [d[:1] for d in want[:len(got)]]  # draft 1 (step 1) is right
    assert got != want  # step 2 onwards drafts from the wrong token


def test_the_unrolled_graph_repeats_the_step_and_ends_in_the_drafts(packages):
    engine = speculant.load(packages["float32", "static"], threads=1)
    from speculant.speculative.chain_graph import step_component

    step = step_component(engine.package)
    steps = len(onnx.load_from_string(step.source).graph.node)
    made = chain_graph.chain_component(step, 5, engine.package.plan.chain.carry_output)
    graph = onnx.load_from_string(made.source).graph
    inputs = {i.name for i in graph.input}
    assert TOKENS in inputs and TOKEN not in inputs
    assert [o.name for o in graph.output] == [DRAFTS]
    assert [d.dim_value for d in graph.output[0].type.tensor_type.shape.dim] == [4]
    def nodes_of(j):
        return [n for n in graph.node if any(v.startswith(f"speculant.chain.s{j}/")
                                             for v in n.output)]
    # each step less its Cast: its int64 argmax feeds the next step's Gather
    assert [len(nodes_of(j)) for j in range(1, 5)] == [steps - 1] * 4
    # step 0 only feeds step 1 its carry: its scores and argmax are not in the graph (ONNX
    # Runtime would run them), the rest of it is
    first = {n.op_type for n in nodes_of(0)}
    assert "ArgMax" not in first and {"MatMul", "Attention"} <= first
    assert len(nodes_of(0)) < steps
    assert len(graph.node) == 2 + len(nodes_of(0)) + 4 * (steps - 1) + 2  # + Concat, Cast
    assert [n.op_type for n in graph.node].count("Cast") == 1 and graph.node[-1].op_type == "Cast"
    assert made.ports.outputs[DRAFTS].dims == [4]


def test_a_one_row_step_takes_the_argmax_of_its_scores_without_copying_the_row(packages):
    """The step graph's epilogue for a one-row step: Flatten (a view), ArgMax, Cast; the row
    Gather a wider step needs would be one more kernel per step on a device."""
    engine = speculant.load(packages["float32", "static"], threads=1)
    from speculant.speculative.chain_graph import step_component

    graph = onnx.load_from_string(step_component(engine.package).source).graph
    assert [n.op_type for n in graph.node[-3:]] == ["Flatten", "ArgMax", "Cast"]
    gathers = [n for n in graph.node if n.op_type == "Gather"]
    assert [n.input[0] for n in gathers] == ["speculant.chain.table"]


def test_a_graph_with_a_subgraph_keeps_the_step_plans():
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "b", [],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["out"], then_branch=branch, else_branch=branch)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1])])
    step = StepComponent(helper.make_model(graph).SerializeToString(), Ports())
    assert chain_graph.chain_component(step, 3, "out") is None


@pytest.mark.parametrize("k", [1, 4])
def test_step_by_step_the_bootstrap_step_runs_without_its_scores(packages, k):
    """Step 0's prediction is p (known): step by step it runs on a graph whose one output is
    the carry (no LM head, no argmax, no table of scores); its carry is the step graph's, so
    the drafts equal the unrolled chain's (above) and the tokens greedy's."""
    from speculant.speculative.chain_graph import bootstrap_component, step_component

    engine = speculant.load(packages["float32", "static"], threads=1)
    greedy = engine.generate(PROMPT, NEW, stop_on_eos=False).token_ids
    result = engine.generate(PROMPT, NEW, speculative=True, k=k, stop_on_eos=False)
    assert result.token_ids == greedy
    bootstrap = engine.proposer.bootstrap_session()
    step = engine.sessions[engine.package.plan.proposer]
    assert bootstrap.num_invocations == result.stats.rounds > 0
    assert step.num_invocations == 1 + result.stats.drafts_proposed  # checked run, steps 1…k_r
    chain = engine.package.plan.chain
    made = bootstrap_component(step_component(engine.package), chain.carry_output)
    graph = onnx.load_from_string(made.source).graph
    assert [o.name for o in graph.output] == [chain.carry_output]
    assert "ArgMax" not in {n.op_type for n in graph.node}
    assert "model.embed_tokens.weight" not in {t.name for t in graph.initializer}
    assert list(made.ports.outputs) == [chain.carry_output]
