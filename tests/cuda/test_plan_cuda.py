"""`PassPlan` on CUDA: the same outputs as invoke, byte for byte; a planned run reads nothing
back and allocates nothing (evidence.md E1).

Run on the GPU machine: ``pytest -m cuda tests/cuda``.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_probe import cuda_marks

import speculant
from builders import encode
from builders.transfer_guard import forbid_host_transfers
from builders.writers import write_decoder_package
from speculant.session.plan import PassPlan
from speculant.session.session import Invocation
from speculant.tensors import HOST, Value

pytestmark = cuda_marks()


@pytest.fixture(scope="module", params=["float32", "float16"])
def decoder(request, tmp_path_factory):
    root = write_decoder_package(tmp_path_factory.mktemp(f"plan-{request.param}"),
                                 dtype=request.param)
    engine = speculant.load(root, device="cuda")
    session = engine.sessions[engine.package.plan.target]
    calls: list[Invocation] = []
    session.observers.append(calls.append)
    engine.generate(encode("def "), max_new_tokens=4, stop_on_eos=False)
    session.observers.remove(calls.append)
    return engine, session, [dict(call.inputs) for call in calls]


def on_host(engine, outputs: dict[str, Value]) -> dict[str, bytes]:
    return {port: engine.seam.adopt(v, HOST).data.tobytes() for port, v in outputs.items()}


@pytest.mark.parametrize("which", [0, 1], ids=["prefill, empty cache", "step at C0=4"])
def test_a_plan_runs_as_invoke_does(decoder, which):
    engine, session, passes = decoder
    plan = PassPlan.prepare(session, passes[which])
    assert all(v.residency == engine.device for v in plan.outputs.values() if v.size)
    assert on_host(engine, plan.run()) == on_host(engine, session.invoke(passes[which]))


def test_a_planned_run_reads_nothing_back_and_allocates_nothing(decoder):
    engine, session, passes = decoder
    plan = PassPlan.prepare(session, passes[1])
    token_port = next(p for p, role in session.ports.roles.items() if role == "token_ids")
    tokens = Value.host(np.array([[11]], dtype=passes[1][token_port].data.dtype))
    counters = engine.seam.counters
    plan.write(token_port, tokens)  # warm CuPy's pool for the upload
    plan.run()
    before = counters.snapshot()
    with forbid_host_transfers():
        for _ in range(5):
            plan.write(token_port, tokens)
            plan.run()
    after = counters.snapshot()
    assert after["device_readback_bytes"] == before["device_readback_bytes"]
    assert after["live_device_allocations"] == before["live_device_allocations"]
    expected = session.invoke({**passes[1], token_port: tokens})
    assert on_host(engine, plan.outputs) == on_host(engine, expected)
