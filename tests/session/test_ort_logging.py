"""ONNX Runtime's logging around CUDA sessions, without a GPU: its default logger is set to
ERROR before a CUDA provider is made (ORT 1.26+ warns "No registered plugin EP device found"
on every CUDA session), and set back to WARNING to print ORT's reason when the CUDA provider
did not load, before the ResidencyError. On a GPU the warning's absence is checked by hand
(scripts/gpu_runbook.sh runs `speculant generate` there); these tests check the calls."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from speculant.errors import ResidencyError
from speculant.package.model import Ports, TensorContract
from speculant.session import session as session_module
from speculant.session.session import (
    DEFAULT_LOGGER_SEVERITY,
    WARNING,
    ComponentSession,
    provider_for,
)
from speculant.tensors import TensorSeam


def identity_session(device: str) -> ComponentSession:
    """``y = x`` over [1] float32."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "identity",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    contract = TensorContract(dtype="float32", rank=1, shape=[1])
    return ComponentSession("identity", model.SerializeToString(),
                            Ports(inputs={"x": contract}, outputs={"y": contract}), device,
                            TensorSeam())


class Stop(Exception):
    """Ends provider_for after the logger is set (CUDA itself is not here)."""


@pytest.fixture
def severities(monkeypatch):
    """The default logger severities set, in order (the process's logger left as it was)."""
    calls: list[int] = []
    monkeypatch.setattr(ort, "set_default_logger_severity", calls.append)
    return calls


def test_a_cuda_provider_quiets_the_default_logger_to_errors(monkeypatch, severities):
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])

    def stop():
        raise Stop
    monkeypatch.setattr(ort, "preload_dlls", stop, raising=False)
    with pytest.raises(Stop):
        provider_for("cuda:0", TensorSeam(), use_tf32=False)
    assert severities == [DEFAULT_LOGGER_SEVERITY] and DEFAULT_LOGGER_SEVERITY == 3


def test_the_cpu_leaves_the_default_logger_alone(severities):
    assert provider_for("host", TensorSeam(), use_tf32=False) == ["CPUExecutionProvider"]
    assert severities == []


def test_a_cuda_provider_that_did_not_load_prints_ort_s_warning_again(monkeypatch,
                                                                       severities):
    """ORT made the session on the CPU (its CUDA library failed to load): the session is made
    once more with the default logger at WARNING, so ORT says why, then speculant refuses."""
    made = []
    real = ort.InferenceSession

    def cpu_session(source, options, providers):
        made.append(providers)
        return real(source, options, providers=["CPUExecutionProvider"])
    monkeypatch.setattr(session_module, "provider_for",
                        lambda *args, **kwargs: [("CUDAExecutionProvider", {})])
    monkeypatch.setattr(ort, "InferenceSession", cpu_session)
    with pytest.raises(ResidencyError, match="asked for CUDAExecutionProvider"):
        identity_session("cuda:0")
    assert severities == [WARNING] and len(made) == 2
