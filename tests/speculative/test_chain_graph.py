"""The drafter's step graph (speculative/chain_graph.py) computes what the proposer's own graph
computes when fed runtime.md §9.4's fused input, bit for bit: every recorded step of a real
run, replayed through the package's unmodified drafter on ``concat(table[token], carry)``,
gives the same logits and carry, and the step's ``NEXT`` is the seam's argmax of its last
score row."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from chain_helpers import PROBE_PROMPT

from speculant.speculative.chain_graph import CARRY, NEXT, TABLE, TOKEN
from speculant.speculative.chained import read_table


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_step_graph_is_the_drafter_fed_the_fused_input(recorded, dtype):
    rec = recorded(PROBE_PROMPT, 4, dtype)
    package = rec.engine.package
    chain = package.plan.chain
    drafter = ort.InferenceSession(package.model_source(package.plan.proposer),
                                   providers=["CPUExecutionProvider"])
    table = read_table(package, chain)  # [V_E, W_E] as the target stores it
    steps = [step for proposal in rec.proposals for step in proposal.steps]
    assert len(steps) > 8
    for step in steps:
        assert np.array_equal(step.inputs[TABLE], table)
        assert step.inputs[TOKEN].dtype == np.int32 and step.inputs[TOKEN].shape == (1,)
        fixed = {port: value for port, value in step.inputs.items()
                 if port not in (TABLE, TOKEN, CARRY)}
        names = [chain.logits_output, chain.carry_output]
        logits, carry = drafter.run(names, {**fixed, chain.fused_port: step.fused})
        assert np.array_equal(step.outputs[chain.logits_output], logits)
        assert np.array_equal(step.outputs[chain.carry_output], carry)


def test_next_is_the_argmax_of_the_last_score_row(recorded):
    rec = recorded(PROBE_PROMPT, 4, "float32")
    session = rec.engine.proposer.session
    chain = rec.engine.package.plan.chain
    for step in (s for p in rec.proposals for s in p.steps):
        inputs = {port: value for port, value in step.inputs.items()}
        logits, next_token = session.session.run([chain.logits_output, NEXT], inputs)
        assert next_token.dtype == np.int32 and next_token.shape == (1,)
        assert next_token[0] == int(np.argmax(logits[0, -1]))


def test_a_drafter_that_uses_the_step_graphs_names_is_refused_at_load(pair_root, tmp_path):
    """A value of the drafter's own named ``speculant.chain.*`` would collide with the step
    graph's: an AdmissionError at load naming the artifact, the value and the remedy."""
    import shutil

    import onnx
    from onnx import helper

    import speculant
    from speculant.errors import AdmissionError
    from speculant.package.loader import load_package

    root = tmp_path / "pair"
    shutil.copytree(pair_root("float32", "onnx"), root)
    package = load_package(root)
    artifact = package.artifacts[package.plan.proposer]
    model = onnx.load(str(artifact))
    source = model.graph.input[0].name
    model.graph.node.append(helper.make_node("Identity", [source], ["speculant.chain.token"]))
    onnx.save(model, str(artifact))
    with pytest.raises(AdmissionError, match=r"speculant\.chain\.token") as caught:
        speculant.load(root)
    problem = caught.value.problems[0]
    assert problem.file == str(artifact) and "rename" in problem.remedy
