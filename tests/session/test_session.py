"""`ComponentSession` and `session/binding.py` on the CPU: binding by pointer into owned
buffers, the timing hook (observers), and contracts checked once per pass."""

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
from speculant.session.binding import adopt_output, bind_input, bind_output, raw_binding
from speculant.session.session import ComponentSession, Invocation
from speculant.tensors import HOST, TensorSeam, Value


def add_session(seam: TensorSeam) -> ComponentSession:
    """``y = x + x`` over [1, n] float32."""
    float_ = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])], "add",
        [helper.make_tensor_value_info("x", float_, [1, "n"])],
        [helper.make_tensor_value_info("y", float_, [1, "n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    contract = TensorContract(dtype="float32", rank=2, shape=[1, "n"])
    return ComponentSession("add", model.SerializeToString(),
                            Ports(inputs={"x": contract}, outputs={"y": contract}), HOST, seam)


def test_binding_by_pointer_into_an_owned_host_buffer():
    seam = TensorSeam()
    session = add_session(seam)
    x = Value.host(np.arange(5, dtype=np.float32)[None])
    out = seam.zeros((1, 5), "float32", HOST)
    binding = session.session.io_binding()
    bind_input(binding, "x", x, seam.host)
    bind_output(binding, "y", HOST, out, seam.host)
    session.session.run_with_iobinding(binding)
    assert out.data.tolist() == [[0, 2, 4, 6, 8]]
    (produced,) = raw_binding(binding).get_outputs()
    assert produced.data_ptr() == seam.host.pointer(out)  # ORT wrote into our buffer
    adopted = adopt_output(produced, HOST, seam.host, "float32")
    assert adopted.data.tolist() == [[0, 2, 4, 6, 8]] and not adopted.owned
    with pytest.raises(ContractError, match="owned buffer"):
        bind_output(binding, "y", HOST, adopted, seam.host)


def test_observers_see_each_invocation_after_they_join():
    session = add_session(TensorSeam())
    x = Value.host(np.ones((1, 3), np.float32))
    session.invoke({"x": x})
    calls: list[Invocation] = []
    session.observers.append(calls.append)
    session.invoke({"x": x})
    session.invoke({"x": x}, ["y"])
    (first, second) = calls
    assert first.component == "add" and first.inputs["x"] is x
    assert first.outputs == ("y",) == second.outputs and 0 < first.seconds < 10


def test_check_false_trusts_the_caller_and_check_true_refuses(monkeypatch):
    session = add_session(TensorSeam())
    wrong = Value.host(np.ones((1, 3), np.float16))
    with pytest.raises(ContractError, match="'x' has dtype float16, its contract says float32"):
        session.invoke({"x": wrong})
    scopes: list[str] = []
    check = contracts.SymbolTable.check
    monkeypatch.setattr(contracts.SymbolTable, "check",
                        lambda self, *a: (scopes.append(self.scope), check(self, *a))[1])
    right = Value.host(np.ones((1, 3), np.float32))
    assert session.invoke({"x": right}, check=False)["y"].data.tolist() == [[2, 2, 2]]
    assert scopes == []
    session.invoke({"x": right})
    assert scopes == ["invocation of component 'add'"] * 2  # the input, then the output


def test_a_target_pass_checks_its_contracts_once(tmp_path, monkeypatch):
    """The pass checks its values at package scope; the session's invocation does not again."""
    engine = speculant.load(write_decoder_package(tmp_path / "decoder"))
    scopes: list[str] = []
    check = contracts.SymbolTable.check
    monkeypatch.setattr(contracts.SymbolTable, "check",
                        lambda self, *a: (scopes.append(self.scope), check(self, *a))[1])
    engine.generate(encode("def "), max_new_tokens=4, stop_on_eos=False)
    assert any(scope.startswith("pass over") for scope in scopes)
    assert not any(scope.startswith("invocation of") for scope in scopes)
