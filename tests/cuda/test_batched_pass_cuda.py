"""The batched pass (docs/design/batching.md) on the CUDA execution provider: ONNX
``Attention`` (opset 24) with ``is_causal`` and ``nonpad_kv_seqlen`` over several query tokens a
row, and ``TensorScatter`` writing in place, with the buffers on the GPU and past and present
bound to one OrtValue. A ragged batch (rows at different lengths and widths, one padding row)
equals the same pass on the CPU, row by row; every byte outside each row's written slots is
unchanged; the presents are the bound buffers. float32 and float16.

Run on the GPU machine: ``pytest -m cuda tests/cuda/test_batched_pass_cuda.py``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gpu_probe import cuda_marks

from export.export_models import CONFIG, TARGET_WEIGHTS
from speculant_tools.export import target_shapes
from speculant_tools.export.batched import batched_target_graph
from speculant_tools.export.config import checked_weights

pytestmark = cuda_marks()
CAPACITY = 32
# Two passes: a ragged prefill, then a ragged verify with a padding row (row 3).
PASSES = [[[7, 3, 41, 12, 25], [9, 2], [33, 48, 2, 17, 5, 6, 30, 11, 40], [14, 8, 21]],
          [[19, 4, 27], [36, 10, 3, 44], [22], []]]
# float32 with TF32 off (the CUDA EP's default would round matmul inputs to 10 bits); float16
# sums in a different order on the two devices (measured on an H100: up to 0.027 on a logit)
TOLERANCE = {"float32": 1e-4, "float16": 5e-2}


def run_passes(ort, model: bytes, dtype: str, provider: str) -> tuple[list, np.ndarray]:
    """Both passes on ``provider``; each pass's per-row logits and the final buffers
    [layers, 2, rows, KV, capacity, d], after checking in place and untouched bytes."""
    c, rows = CONFIG, len(PASSES[0])
    options = ort.SessionOptions()
    options.log_severity_level = 3
    providers = [(provider, {"use_tf32": "0"})] if provider.startswith("CUDA") else [provider]
    session = ort.InferenceSession(model, options, providers=providers)
    device = "cuda" if provider.startswith("CUDA") else "cpu"
    storage = np.float16 if dtype == "float16" else np.float32
    fill = np.random.default_rng(5).standard_normal(
        (c.num_hidden_layers, 2, rows, c.num_key_value_heads, CAPACITY, c.head_dim))
    buffers = {(i, j): ort.OrtValue.ortvalue_from_numpy(
        np.ascontiguousarray(fill[i, j].astype(storage)), device, 0)
        for i in range(c.num_hidden_layers) for j in range(2)}
    lengths = np.zeros(rows, np.int64)
    outputs = []
    for blocks in PASSES:
        before = np.stack([np.stack([buffers[i, j].numpy() for j in range(2)])
                           for i in range(c.num_hidden_layers)])
        width = max(len(b) for b in blocks)
        ids = np.zeros((rows, width), np.int64)
        for b, block in enumerate(blocks):
            ids[b, :len(block)] = block
        widths = np.array([len(b) for b in blocks], np.int64)
        binding = session.io_binding()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("position_ids", lengths[:, None] + np.arange(width)[None])
        binding.bind_cpu_input("cache_lengths", lengths.copy())
        binding.bind_cpu_input("block_lengths", widths)
        binding.bind_output("logits")
        binding.bind_output("hidden_states")
        for (i, j), buffer in buffers.items():
            part = ("key", "value")[j]
            binding.bind_ortvalue_input(f"past_key_values.{i}.{part}", buffer)
            binding.bind_ortvalue_output(f"present.{i}.{part}", buffer)
        session.run_with_iobinding(binding)
        results = binding.get_outputs()
        for (key, buffer), present in zip(buffers.items(), results[2:], strict=True):
            assert present.data_ptr() == buffer.data_ptr(), f"present {key} not in place"
        after = np.stack([np.stack([buffers[i, j].numpy() for j in range(2)])
                          for i in range(c.num_hidden_layers)])
        changed = (before != after).any(axis=(0, 1, 3, 5))
        for b, block in enumerate(blocks):
            allowed = np.zeros(CAPACITY, bool)
            allowed[lengths[b]:lengths[b] + len(block)] = True
            assert not (changed[b] & ~allowed).any(), f"{provider}: row {b} written outside"
        logits = results[0].numpy().astype(np.float32)
        outputs.append([logits[b, :len(block)] for b, block in enumerate(blocks)])
        lengths = lengths + widths
    return outputs, after


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_batched_pass_on_cuda_equals_cpu(dtype: str) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDA execution provider here")
    weights = checked_weights(TARGET_WEIGHTS, target_shapes(CONFIG), dtype, "target")
    model = batched_target_graph(CONFIG, weights, dtype).SerializeToString()
    onnx.checker.check_model(onnx.load_from_string(model))
    cpu, cpu_buffers = run_passes(ort, model, dtype, "CPUExecutionProvider")
    gpu, gpu_buffers = run_passes(ort, model, dtype, "CUDAExecutionProvider")
    tol = TOLERANCE[dtype]
    for p, (cpu_rows, gpu_rows) in enumerate(zip(cpu, gpu, strict=True)):
        for b, (want, got) in enumerate(zip(cpu_rows, gpu_rows, strict=True)):
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol,
                                       err_msg=f"pass {p} row {b}")
    np.testing.assert_allclose(gpu_buffers.astype(np.float32),
                               cpu_buffers.astype(np.float32), rtol=tol, atol=tol)
