"""The fused float16 target (export/fused.py): chosen where ONNX Runtime's kernels take it,
the same function as the node-by-node graph, the same weights read back."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from export_models import CONFIG, TARGET_WEIGHTS

from speculant.export import read_weights
from speculant.export.fused import fusable, fused_target_graph
from speculant.export.graphs import target_graph
from speculant.export.package import target_builder

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


def test_the_choice_follows_dtype_and_head_size():
    assert target_builder(C, "float16") is fused_target_graph
    assert target_builder(C, "float32") is target_graph
    narrow = dataclasses.replace(C, head_dim=8)  # GroupQueryAttention's rotary needs 16 | d
    assert not fusable(narrow, "float16") and target_builder(narrow, "float16") is target_graph
    with pytest.raises(ValueError, match="head_dim multiple of 16"):
        fused_target_graph(narrow, {}, "float16")
    with pytest.raises(ValueError, match="float32"):
        fused_target_graph(C, {}, "float32")


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


def test_fused_equals_the_node_by_node_graph_in_float16():
    """Prefill, then a 4-token block after that past (the verify pass), then one token:
    logits, hidden states and every present agree within float16 rounding, argmax equal."""
    weights = {name: array.astype(np.float16) for name, array in TARGET_WEIGHTS.items()}
    sessions = [ort.InferenceSession(build(C, weights, "float16").SerializeToString(),
                                     providers=["CPUExecutionProvider"])
                for build in (target_graph, fused_target_graph)]
    empty = [np.zeros((1, C.num_key_value_heads, 0, C.head_dim), np.float16)] * (
        2 * C.num_hidden_layers)
    pasts = [empty, empty]
    for ids in (PROMPT, BLOCK, [5]):
        explicit, fused = (run(sess, ids, past) for sess, past in zip(sessions, pasts,
                                                                      strict=True))
        assert explicit.keys() == fused.keys()
        for name in explicit:
            assert explicit[name].shape == fused[name].shape, name
            np.testing.assert_allclose(fused[name].astype(np.float32),
                                       explicit[name].astype(np.float32), rtol=2e-2,
                                       atol=6e-2, err_msg=name)
        assert (explicit["logits"].argmax(-1) == fused["logits"].argmax(-1)).all()
        pasts = [[out[f"present.{i}.{p}"] for i in range(C.num_hidden_layers)
                  for p in ("key", "value")] for out in (explicit, fused)]
    assert pasts[1][0].shape[2] == len(PROMPT) + len(BLOCK) + 1


def test_a_fused_package_reads_back_its_weights(pair_roots):
    _, weights, _ = read_weights(pair_roots["float16"])
    assert weights.keys() == TARGET_WEIGHTS.keys()  # no packed or extra initializer leaks
    for name, array in TARGET_WEIGHTS.items():
        np.testing.assert_array_equal(weights[name], array.astype(np.float16), err_msg=name)
