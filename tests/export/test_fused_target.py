"""The fused float16 target (export/fused.py): chosen where ONNX Runtime's kernels take it,
the same function as the node-by-node graph, the same weights read back."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from export_models import CONFIG, TARGET_WEIGHTS

import speculant
from speculant_tools.export import ExportError, convert, read_weights
from speculant_tools.export.fused import fusable, fused_target_graph
from speculant_tools.export.graphs import target_graph
from speculant_tools.export.package import target_builder

PROMPT = [7, 3, 41, 12, 25, 9]
BLOCK = [33, 48, 2, 17]
C = CONFIG


def op_types(path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path)).graph.node}


def test_float16_packages_get_the_fused_target(pair_roots):
    fused = op_types(pair_roots["float16"] / "target" / "model.onnx")
    assert {"GroupQueryAttention", "SkipSimplifiedLayerNormalization",
            "SimplifiedLayerNormalization"} <= fused
    explicit = op_types(pair_roots["float32"] / "target" / "model.onnx")
    assert "GroupQueryAttention" not in explicit and "Softmax" in explicit
    assert "Softmax" not in fused  # attention is one kernel
    drafter = op_types(pair_roots["float16"] / "assistant" / "model.onnx")
    assert {"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"} <= drafter
    assert "ReduceMean" not in drafter and "Softmax" in drafter  # fused norms; its attention
    # reads the borrowed cache without a causal term, so it stays node by node
    assert "SkipSimplifiedLayerNormalization" not in op_types(
        pair_roots["float32"] / "assistant" / "model.onnx")


def test_the_choice_follows_dtype_head_size_and_graph():
    assert target_builder(C, "float16") is fused_target_graph  # auto: float16 runs anywhere
    assert target_builder(C, "float32") is target_graph  # no float32 GQA kernel on CUDA
    assert target_builder(C, "float32", "fused") is fused_target_graph  # for the CPU
    assert target_builder(C, "float16", "explicit") is target_graph
    narrow = dataclasses.replace(C, head_dim=8)  # GroupQueryAttention's rotary needs 16 | d
    assert not fusable(narrow, "float16") and target_builder(narrow, "float16") is target_graph
    with pytest.raises(ExportError, match="head_dim 8") as refused:
        target_builder(narrow, "float16", "fused")
    assert "explicit" in refused.value.problems[0].remedy
    with pytest.raises(ExportError, match="no fused target for bfloat16"):
        target_builder(C, "bfloat16", "fused")
    with pytest.raises(ExportError, match="graph must be one of"):
        target_builder(C, "float16", "fast")
    with pytest.raises(ValueError, match="head_dim multiple of 16"):
        fused_target_graph(narrow, {}, "float16")


def run(sess, ids, pasts) -> dict[str, np.ndarray]:
    start = pasts[0].shape[2]
    feeds = {"input_ids": np.array([ids], np.int64),
             "attention_mask": np.ones((1, start + len(ids)), np.int64),
             "position_ids": np.arange(start, start + len(ids), dtype=np.int64)[None]}
    for i in range(C.num_hidden_layers):
        feeds[f"past_key_values.{i}.key"] = pasts[2 * i]
        feeds[f"past_key_values.{i}.value"] = pasts[2 * i + 1]
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


TOLERANCE = {"float16": (2e-2, 6e-2), "float32": (1e-5, 1e-4)}  # (rtol, atol)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_fused_equals_the_node_by_node_graph(dtype):
    """Prefill, then a 4-token block after that past (the verify pass), then one token:
    logits, hidden states and every present agree (float32: to summation order; float16:
    within its rounding), argmax equal."""
    storage = np.float16 if dtype == "float16" else np.float32
    weights = {name: array.astype(storage) for name, array in TARGET_WEIGHTS.items()}
    sessions = [ort.InferenceSession(build(C, weights, dtype).SerializeToString(),
                                     providers=["CPUExecutionProvider"])
                for build in (target_graph, fused_target_graph)]
    rtol, atol = TOLERANCE[dtype]
    empty = [np.zeros((1, C.num_key_value_heads, 0, C.head_dim), storage)] * (
        2 * C.num_hidden_layers)
    pasts = [empty, empty]
    for ids in (PROMPT, BLOCK, [5]):
        explicit, fused = (run(sess, ids, past) for sess, past in zip(sessions, pasts,
                                                                      strict=True))
        assert explicit.keys() == fused.keys()
        for name in explicit:
            assert explicit[name].shape == fused[name].shape, name
            np.testing.assert_allclose(fused[name].astype(np.float32),
                                       explicit[name].astype(np.float32), rtol=rtol,
                                       atol=atol, err_msg=name)
        assert (explicit["logits"].argmax(-1) == fused["logits"].argmax(-1)).all()
        pasts = [[out[f"present.{i}.{p}"] for i in range(C.num_hidden_layers)
                  for p in ("key", "value")] for out in (explicit, fused)]
    assert pasts[1][0].shape[2] == len(PROMPT) + len(BLOCK) + 1


def test_a_fused_package_reads_back_its_weights(pair_roots):
    _, weights, _ = read_weights(pair_roots["float16"])
    assert weights.keys() == TARGET_WEIGHTS.keys()  # no packed or extra initializer leaks
    for name, array in TARGET_WEIGHTS.items():
        np.testing.assert_array_equal(weights[name], array.astype(np.float16), err_msg=name)


def test_a_float32_fused_pair_decodes_as_the_node_by_node_pair(pair_root, tmp_path):
    """``convert --graph fused`` at float32 (the CPU's fused target): greedy and chained
    tokens equal the node-by-node package's, chained traces too."""
    fused_root = convert(pair_root, tmp_path / "fused32", "float32", graph="fused")
    assert "GroupQueryAttention" in op_types(fused_root / "target" / "model.onnx")
    explicit, fused = speculant.load(pair_root), speculant.load(fused_root)
    for prompt in ([7, 3, 41, 12, 25], [20, 21]):
        for options in ({}, {"speculative": True, "k": 4}):
            want = explicit.generate(prompt, 20, stop_on_eos=False, **options)
            got = fused.generate(prompt, 20, stop_on_eos=False, **options)
            assert got.token_ids == want.token_ids, (prompt, options)
            assert got.stats.trace == want.stats.trace


def test_a_refused_fused_graph_names_the_remedy(pair_root, monkeypatch):
    """Where ONNX Runtime refuses a GroupQueryAttention node (CUDA has no float32 kernel),
    the admission error says which package runs where and how to rebuild it."""
    from speculant.errors import AdmissionError
    from speculant.session import session as session_module

    def refuse(*args, **kwargs):
        raise RuntimeError("Could not find an implementation for GroupQueryAttention(1) node "
                           "with name 'gqa_21'")

    monkeypatch.setattr(session_module, "provider_for", lambda *a, **k: ["CUDAExecutionProvider"])
    monkeypatch.setattr(session_module.ort, "InferenceSession", refuse)
    with pytest.raises(AdmissionError, match="GroupQueryAttention") as refused:
        session_module.ComponentSession("target", "model.onnx", None, "cuda:0", None)
    assert "--dtype float16" in refused.value.problems[0].remedy
    assert session_module._remedy_for("some other refusal", "cuda:0") == ""
    assert session_module._remedy_for("GroupQueryAttention", "host") == ""
