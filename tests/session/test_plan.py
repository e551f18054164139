"""`PassPlan` on the CPU against the plain invoke path: the same outputs bit for bit, with
the binding made once and the contracts checked once, when the plan is made."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import speculant
from builders import encode
from builders.writers import write_decoder_package
from speculant.errors import ContractError
from speculant.package.model import Ports, TensorContract
from speculant.session import contracts
from speculant.session.plan import PassPlan
from speculant.session.session import ComponentSession, Invocation
from speculant.tensors import HOST, TensorSeam, Value


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """The decoder's session and the inputs of its passes over a short greedy decode."""
    engine = speculant.load(write_decoder_package(tmp_path_factory.mktemp("plan") / "decoder"))
    session = engine.sessions[engine.package.plan.target]
    calls: list[Invocation] = []
    session.observers.append(calls.append)
    engine.generate(encode("def "), max_new_tokens=4, stop_on_eos=False)
    session.observers.remove(calls.append)
    return session, [dict(call.inputs) for call in calls]


def assert_identical(expected: dict[str, Value], got: dict[str, Value]) -> None:
    assert sorted(got) == sorted(expected)
    for port, value in expected.items():
        assert got[port].shape == value.shape, port
        assert got[port].dtype == value.dtype, port
        assert got[port].data.tobytes() == value.data.tobytes(), port


def port_of(session, role: str) -> str:
    return next(port for port, r in session.ports.roles.items() if r == role)


@pytest.mark.parametrize("which", [0, 1], ids=["prefill, empty cache", "step at C0=4"])
def test_a_plan_runs_as_invoke_does_bit_for_bit(decoder, which):
    session, passes = decoder
    inputs = passes[which]
    plan = PassPlan.prepare(session, inputs)
    assert_identical(session.invoke(inputs), plan.run())
    assert_identical(session.invoke(inputs), plan.run())  # and again, on the same buffers


def test_a_pass_writes_only_what_changes(decoder, monkeypatch):
    session, passes = decoder
    inputs = passes[1]  # one token at C0=4
    plan = PassPlan.prepare(session, inputs)
    first = plan.run()
    addresses = {port: v.data.ctypes.data for port, v in first.items()}
    token_port, position_port = port_of(session, "token_ids"), port_of(session, "position_ids")

    def refuse(*args, **kwargs):
        raise AssertionError("a planned run binds or checks nothing")

    monkeypatch.setattr(session.session, "io_binding", refuse)
    monkeypatch.setattr(contracts.SymbolTable, "check", refuse)
    logits_port = port_of(session, "logits")
    seen: set[bytes] = set()
    for token, position in [(3, 4), (11, 4), (5, 2)]:
        tokens = np.array([[token]], dtype=inputs[token_port].data.dtype)
        positions = np.array([[position]], dtype=inputs[position_port].data.dtype)
        plan.write(token_port, tokens)
        plan.write(position_port, Value.host(positions))
        got = {port: Value.host(np.array(v.data), v.dtype) for port, v in plan.run().items()}
        assert {port: v.data.ctypes.data for port, v in plan.outputs.items()} == addresses
        monkeypatch.undo()
        expected = session.invoke({**inputs, token_port: Value.host(tokens),
                                   position_port: Value.host(positions)})
        monkeypatch.setattr(session.session, "io_binding", refuse)
        monkeypatch.setattr(contracts.SymbolTable, "check", refuse)
        assert_identical(expected, got)
        seen.add(got[logits_port].data.tobytes())
    assert len(seen) == 3  # each write changed what the run computed
    assert plan.num_runs == 4


def test_a_write_of_another_shape_or_port_is_refused(decoder):
    session, passes = decoder
    plan = PassPlan.prepare(session, passes[1])
    token_port = port_of(session, "token_ids")
    with pytest.raises(ContractError, match=r"as \[1, 1\] int64, got a host array \[1, 2\]"):
        plan.write(token_port, np.zeros((1, 2), np.int64))
    with pytest.raises(ContractError, match=r"planned as \[1, 1\] int64, got \[1, 1\] int32"):
        plan.write(token_port, Value.host(np.zeros((1, 1), np.int32)))
    with pytest.raises(ContractError, match=r"got a host array \[1, 1\] float64"):
        plan.write(token_port, np.zeros((1, 1), np.float64))
    with pytest.raises(ContractError, match="has no input 'nope'"):
        plan.write("nope", np.zeros((1, 1), np.int64))


def test_contracts_are_checked_when_the_plan_is_made(decoder):
    session, passes = decoder
    token_port = port_of(session, "token_ids")
    wrong = {**passes[1], token_port: Value.host(np.zeros((1, 1), np.int32))}
    with pytest.raises(ContractError, match="has dtype int32, its contract says int64"):
        PassPlan.prepare(session, wrong)


def test_observers_see_planned_runs(decoder):
    session, passes = decoder
    plan = PassPlan.prepare(session, passes[1])
    calls: list[Invocation] = []
    session.observers.append(calls.append)
    try:
        plan.run()
    finally:
        session.observers.remove(calls.append)
    assert len(calls) == 1 and calls[0].inputs is plan.inputs and calls[0].seconds > 0


def scatter_session() -> ComponentSession:
    """``present = ScatterND(past, indices, updates)``: a fixed-capacity cache of 8 cells
    written at ``indices`` (the standard's indexed-scatter form)."""
    float_, int64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    graph = helper.make_graph(
        [helper.make_node("ScatterND", ["past", "indices", "updates"], ["present"])], "cache",
        [helper.make_tensor_value_info("past", float_, [8]),
         helper.make_tensor_value_info("indices", int64, ["n", 1]),
         helper.make_tensor_value_info("updates", float_, ["n"])],
        [helper.make_tensor_value_info("present", float_, [8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    cache = TensorContract(dtype="float32", rank=1, shape=[8])
    ports = Ports(inputs={"past": cache,
                          "indices": TensorContract(dtype="int64", rank=2, shape=["n", 1]),
                          "updates": TensorContract(dtype="float32", rank=1, shape=["n"])},
                  outputs={"present": cache})
    return ComponentSession("cache", model.SerializeToString(), ports, HOST, TensorSeam())


def test_a_shared_output_writes_its_input_buffer_in_place():
    session = scatter_session()
    first = {"past": Value.host(np.zeros(8, np.float32)),
             "indices": Value.host(np.array([[2]], np.int64)),
             "updates": Value.host(np.array([5.0], np.float32))}
    plan = PassPlan.prepare(session, first, shared={"present": "past"})
    cache = plan.inputs["past"]
    assert plan.outputs["present"] is cache  # one buffer: the pass writes its block in place
    expected = session.invoke(first)["present"]
    assert plan.run()["present"].data.tobytes() == expected.data.tobytes()
    for position, number in [(4, 7.0), (0, -1.0)]:
        plan.write("indices", np.array([[position]], np.int64))
        plan.write("updates", np.array([number], np.float32))
        expected = session.invoke({"past": Value.host(np.array(expected.data)),
                                   "indices": plan.inputs["indices"],
                                   "updates": plan.inputs["updates"]})["present"]
        assert plan.run()["present"].data.tobytes() == expected.data.tobytes()
    assert cache.data.tolist() == [-1, 0, 5, 0, 7, 0, 0, 0]


def test_a_shared_output_needs_its_inputs_shape():
    session = scatter_session()
    inputs = {"past": Value.host(np.zeros(8, np.float32)),
              "indices": Value.host(np.array([[2]], np.int64)),
              "updates": Value.host(np.array([5.0], np.float32))}
    with pytest.raises(ContractError, match="cannot share one buffer"):
        PassPlan.prepare(session, inputs, shared={"present": "updates"})
    with pytest.raises(ContractError, match="cannot write output 'logits'"):
        PassPlan.prepare(session, inputs, shared={"logits": "past"})
