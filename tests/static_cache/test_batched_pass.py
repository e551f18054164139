"""The batched pass (``export/batched.py``, docs/design/batching.md) driven by raw ONNX
Runtime on the CPU in float32: a ragged batch (rows at different lengths with different block
widths, one padding row) through one pass equals each row's own batch-1 pass on the static
target; each pass writes only the rows' valid slots (every other byte of the buffers is
unchanged, the padding included); a rollback is a length change that moves no byte and the
next pass still equals batch 1. Planted defects: padding written, a stale length."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from static_driver import BatchedTarget, StaticTarget

from export.export_models import CONFIG, TARGET_WEIGHTS
from speculant_tools.export import target_shapes
from speculant_tools.export.batched import BLOCK_LENGTHS, batched_target_graph
from speculant_tools.export.config import checked_weights
from speculant_tools.export.errors import ExportError
from speculant_tools.export.fused import fused_target_graph
from speculant_tools.export.graphs import target_graph

CAPACITY = 24
# Per pass, each row's block (rows at lengths 0 after the prefill's ragged prompts); row 3
# pads the batch in the second and fourth passes; the rollbacks before the third pass.
PREFILL = [[7, 3, 41, 12, 25], [9, 2], [33, 48, 2, 17, 5, 6, 30, 11, 40], [14, 8, 21]]
VERIFY = [[19, 4, 27], [36, 10, 3, 44], [22], []]
KEEP = {0: 1, 1: 2}  # row -> drafts kept of VERIFY's block: lengths 5 + 1, 2 + 2
AFTER = [[29, 13], [1, 45, 7], [16, 38, 20], [6]]
LAST = [[18], [], [42, 43, 2, 15], [26, 31]]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """The batched target and the batch-1 static target (node by node) of the tiny config."""
    base = tmp_path_factory.mktemp("batched")
    weights = checked_weights(TARGET_WEIGHTS, target_shapes(CONFIG), "float32", "target")
    paths = {"batched": base / "batched.onnx", "static": base / "static" / "target" /
             "model.onnx"}
    paths["static"].parent.mkdir(parents=True)
    onnx.save(batched_target_graph(CONFIG, weights, "float32"), str(paths["batched"]))
    onnx.save(target_graph(CONFIG, weights, "float32", cache="static"), str(paths["static"]))
    return paths


def random_fill(rows: int) -> np.ndarray:
    """Buffer contents before any pass: distinct random values, so any write shows."""
    c = CONFIG
    return np.random.default_rng(5).standard_normal(
        (c.num_hidden_layers, 2, rows, c.num_key_value_heads, CAPACITY, c.head_dim))


def assert_written_only(before: np.ndarray, after: np.ndarray, lengths: np.ndarray,
                        blocks: list[list[int]]) -> None:
    """Every byte outside each row's slots ``[L_b, L_b + W_b)`` is the byte it was."""
    changed = (before != after).any(axis=(0, 1, 3, 5))  # [rows, capacity]
    for b, block in enumerate(blocks):
        allowed = np.zeros(CAPACITY, bool)
        allowed[lengths[b]:lengths[b] + len(block)] = True
        outside = np.flatnonzero(changed[b] & ~allowed)
        assert outside.size == 0, f"row {b} written at slots {outside.tolist()}"
        assert changed[b, allowed].all() or not block


def run_checked(batch: BatchedTarget, singles: list[StaticTarget],
                blocks: list[list[int]], atol: float = 1e-5, cache_atol: float = 1e-5) -> None:
    """One batched pass equals each row's batch-1 pass (logits within ``atol``), writes only
    the rows' valid slots (exactly: every other byte is unchanged), in place, and leaves each
    row's valid slots equal to batch 1's (within ``cache_atol``)."""
    before, lengths = batch.snapshot(), batch.lengths.copy()
    rows = batch.run(blocks)
    assert_written_only(before, batch.snapshot(), lengths, blocks)
    for b, (block, single) in enumerate(zip(blocks, singles, strict=True)):
        assert single.length == lengths[b]
        if block:
            np.testing.assert_allclose(rows[b], single.run(block), rtol=1e-5, atol=atol)
        for (i, part), cell in single.cells().items():
            np.testing.assert_allclose(batch.buffers[i, part].numpy()[b, :, :single.length],
                                       cell[0], rtol=1e-5, atol=cache_atol)
    for key, buffer in batch.buffers.items():  # the present is the bound buffer
        assert batch.presents[key].data_ptr() == buffer.data_ptr()


def test_a_ragged_batch_equals_each_row_alone_and_rolls_back_by_length(models):
    rows = len(PREFILL)
    batch = BatchedTarget(models["batched"], rows, CAPACITY, random_fill(rows))
    singles = [StaticTarget(models["static"].parent.parent, CAPACITY) for _ in range(rows)]
    run_checked(batch, singles, PREFILL)
    run_checked(batch, singles, VERIFY)
    before = batch.snapshot()
    for b, kept in KEEP.items():  # rollback: a length change per row
        batch.lengths[b] = len(PREFILL[b]) + kept
        singles[b].rollback(len(PREFILL[b]) + kept)
    assert (batch.snapshot() == before).all()  # zero bytes moved
    run_checked(batch, singles, AFTER)
    run_checked(batch, singles, LAST)
    assert batch.lengths.tolist() == [6 + 2 + 1, 4 + 3, 10 + 3 + 4, 3 + 1 + 2]


@pytest.fixture(scope="module")
def models16(tmp_path_factory) -> dict[str, Path]:
    """The batched target in float16 (the package dtype the GPU runs) and the two batch-1
    static targets a float16 package can have: node by node, and fused
    (GroupQueryAttention, what ``graph="auto"`` writes for float16)."""
    base = tmp_path_factory.mktemp("batched16")
    weights = checked_weights(TARGET_WEIGHTS, target_shapes(CONFIG), "float16", "target")
    paths = {"batched": base / "batched.onnx"}
    onnx.save(batched_target_graph(CONFIG, weights, "float16"), str(paths["batched"]))
    for graph, build in (("explicit", target_graph), ("fused", fused_target_graph)):
        paths[graph] = base / graph / "target" / "model.onnx"
        paths[graph].parent.mkdir(parents=True)
        onnx.save(build(CONFIG, weights, "float16", cache="static"), str(paths[graph]))
    return paths


# Float16 tolerances: logits of magnitude up to ~29 lie 2^-6 apart there, and the batched
# graph attends in float16 (ONNX Attention) where the batch-1 graphs attend in float32
# (explicit) or with another kernel (GroupQueryAttention). Measured (onnxruntime 1.32, CPU):
# |Δ| ≤ 0.039 (explicit), ≤ 0.094 (fused) on logits; ≤ 0.007, ≤ 0.020 on the cache slots.
# Allowed: 12 steps of 2^-6 on logits, twice the largest measured on the slots.
FLOAT16_LOGITS, FLOAT16_CACHE = 0.1875, 0.04


@pytest.mark.parametrize("graph", ["explicit", "fused"])
def test_a_float16_batch_equals_each_row_alone_within_float16(models16, graph):
    """The same ragged passes and rollbacks as the float32 test, in float16: each row's
    logits within :data:`FLOAT16_LOGITS` of its batch-1 static pass, the padding and every
    byte outside the rows' valid slots unchanged exactly."""
    rows = len(PREFILL)
    batch = BatchedTarget(models16["batched"], rows, CAPACITY, random_fill(rows))
    assert batch.buffers[0, "key"].numpy().dtype == np.float16
    singles = [StaticTarget(models16[graph].parent.parent, CAPACITY) for _ in range(rows)]
    tolerances = {"atol": FLOAT16_LOGITS, "cache_atol": FLOAT16_CACHE}
    run_checked(batch, singles, PREFILL, **tolerances)
    run_checked(batch, singles, VERIFY, **tolerances)
    before = batch.snapshot()
    for b, kept in KEEP.items():
        batch.lengths[b] = len(PREFILL[b]) + kept
        singles[b].rollback(len(PREFILL[b]) + kept)
    assert (batch.snapshot() == before).all()
    run_checked(batch, singles, AFTER, **tolerances)
    run_checked(batch, singles, LAST, **tolerances)


def test_padding_written_is_caught(models):
    """Planted: the driver binds the block width W for every row, so each padding slot gets
    the padding token's keys: the bytes check names the row and slots."""
    batch = BatchedTarget(models["batched"], 4, CAPACITY, random_fill(4),
                          defect="full_block_lengths")
    singles = [StaticTarget(models["static"].parent.parent, CAPACITY) for _ in range(4)]
    with pytest.raises(AssertionError, match=r"row 0 written at slots \[5, 6, 7, 8\]"):
        run_checked(batch, singles, PREFILL)


def test_a_stale_length_after_rollback_is_caught(models):
    """Planted: a row rolled back on batch 1 but not in the batch reads its rejected slots."""
    batch = BatchedTarget(models["batched"], 4, CAPACITY, random_fill(4))
    singles = [StaticTarget(models["static"].parent.parent, CAPACITY) for _ in range(4)]
    run_checked(batch, singles, PREFILL)
    run_checked(batch, singles, VERIFY)
    singles[0].rollback(len(PREFILL[0]) + 1)  # the batch keeps row 0's length: stale
    with pytest.raises(AssertionError):
        run_checked(batch, singles, AFTER)


def test_the_graph_contract(models):
    """The batched target's inputs: the static form's plus ``block_lengths`` [batch]; each
    present is the TensorScatter that writes it; attention is ONNX's Attention, causal."""
    graph = onnx.load(str(models["batched"])).graph
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
              for i in graph.input}
    assert inputs[BLOCK_LENGTHS] == inputs["cache_lengths"] == ["batch"]
    assert inputs["input_ids"] == inputs["position_ids"] == ["batch", "sequence"]
    assert inputs["past_key_values.0.key"] == ["batch", 2, "capacity", 16]
    producers = {out: node for node in graph.node for out in node.output}
    for i in range(CONFIG.num_hidden_layers):
        assert producers[f"present.{i}.key"].op_type == "TensorScatter"
    attends = [node for node in graph.node if node.op_type == "Attention"]
    assert len(attends) == CONFIG.num_hidden_layers
    assert all(onnx.helper.get_attribute_value(a.attribute[0]) == 1 for a in attends
               if a.attribute[0].name == "is_causal")


def test_sliding_layers_are_refused_by_field():
    from dataclasses import replace
    config = replace(CONFIG, sliding_window=8)
    weights = checked_weights(TARGET_WEIGHTS, target_shapes(config), "float32", "target")
    with pytest.raises(ExportError, match="sliding") as caught:
        batched_target_graph(config, weights, "float32")
    assert "sliding_window" in str(caught.value)
