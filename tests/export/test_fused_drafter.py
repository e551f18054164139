"""The chained drafter's fused attention (export/graphs.py ``_Graph.fused_attention``): on
static caches its queries are rotated by ONNX's RotaryEmbedding and attend through ONNX's
Attention with ``nonpad_kv_seqlen``; the same function as the explicit graph and the numpy
reference, never reading a slot at or past the valid length."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS
from export_reference import drafter_forward

from speculant_tools.export import RopeScaling
from speculant_tools.export.graphs import drafter_graph

C = CONFIG
CAPACITY = 24
NP = {"float32": np.float32, "float16": np.float16}
TOLERANCE = {"float32": (1e-5, 2e-5), "float16": (2e-2, 6e-2)}  # (rtol, atol) vs float64


PARTIAL = replace(C, rotary_dim=C.head_dim // 2)  # a partial-rotary target's drafter


def drafter_model(dtype: str, fused_attention: bool | None, cache: str = "static",
                  config=C) -> onnx.ModelProto:
    cast = {name: array.astype(NP[dtype]) for name, array in DRAFTER_WEIGHTS.items()}
    return drafter_graph(config, cast,
                         TARGET_WEIGHTS["model.embed_tokens.weight"].astype(NP[dtype]),
                         dtype, fused_norms=True, cache=cache, fused_attention=fused_attention)


def drafter(dtype: str, fused_attention: bool, config=C) -> ort.InferenceSession:
    return ort.InferenceSession(
        drafter_model(dtype, fused_attention, config=config).SerializeToString(),
        providers=["CPUExecutionProvider"])


def test_static_fused_drafters_take_the_fused_attention_by_default():
    ops = [node.op_type for node in drafter_model("float16", None).graph.node]
    assert {"RotaryEmbedding", "Attention"} <= set(ops)
    assert "Softmax" not in ops and "Identity" not in ops  # outputs are the nodes' own
    model = drafter_model("float16", None, cache="appended")  # a mask, not a length
    assert "Attention" not in {node.op_type for node in model.graph.node}
    with pytest.raises(ValueError, match="static cache form"):
        drafter_model("float16", True, cache="appended")


@pytest.mark.parametrize("config", [C, PARTIAL], ids=["whole-head", "partial-rotary"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fused_attention_equals_the_reference_within_the_valid_length(dtype, config):
    """Slots at and past ``cache_lengths`` hold values 50x larger than the valid ones: an
    attention that read one of them (a length off by one, the capacity instead of the length)
    moves the logits far past the tolerance. Rows 1 and 3, two lengths, the explicit graph
    beside it; a partial-rotary target's drafter turns the same values its keys were."""
    rng = np.random.default_rng(11)
    sessions = {fused: drafter(dtype, fused, config) for fused in (False, True)}
    table = TARGET_WEIGHTS["model.embed_tokens.weight"].astype(NP[dtype])
    weights = {name: array.astype(NP[dtype]) for name, array in DRAFTER_WEIGHTS.items()}
    rtol, atol = TOLERANCE[dtype]
    for rows, length in ((1, 9), (3, 17)):
        key, value = (np.concatenate([
            rng.standard_normal((1, C.num_key_value_heads, length, C.head_dim)),
            50 * rng.standard_normal((1, C.num_key_value_heads, CAPACITY - length, C.head_dim))],
            axis=2).astype(NP[dtype]) for _ in range(2))  # [1, KV, capacity, d]
        fused = rng.standard_normal((1, rows, 2 * C.hidden_size)).astype(NP[dtype])
        positions = np.arange(length - 1, length - 1 + rows, dtype=np.int64)[None]
        feeds = {"inputs_embeds": fused, "position_ids": positions,
                 "cache_lengths": np.array([length], np.int64),
                 "shared_kv.key": key, "shared_kv.value": value}
        ref_logits, ref_state = drafter_forward(config, weights, table, fused[0], positions[0],
                                                key[0], value[0],
                                                (np.arange(CAPACITY) < length).astype(np.int64))
        for is_fused, sess in sessions.items():
            logits, state = sess.run(["logits", "projected_state"], feeds)
            what = f"{'fused' if is_fused else 'explicit'} drafter, {rows} rows, length {length}"
            assert logits.dtype == state.dtype == NP[dtype], what
            np.testing.assert_allclose(logits[0].astype(np.float64), ref_logits, rtol=rtol,
                                       atol=atol, err_msg=what)
            np.testing.assert_allclose(state[0].astype(np.float64), ref_state, rtol=rtol,
                                       atol=atol, err_msg=what)


LONGROPE = replace(C, rope_scaling=RopeScaling(
    "longrope", frequency_factors=(1.0, 1.5, 2.0, 3.5, 1.2, 4.0, 8.0, 2.5),
    attention_factor=1.2, long_factors=(9.0,) * 8, original_max_position_embeddings=16))


@pytest.mark.parametrize(("cache", "fused_attention"),
                         [("static", False), ("static", True), ("appended", False)])
def test_a_longrope_drafter_turns_each_row_with_its_own_table(cache, fused_attention):
    """One step of two rows: row 0's query at position 10 (a sequence of 11, under the
    original 16) turns with the short factors, row 1's at 20 with the long ones; each row
    equals the reference of its own step, and row 1 not the short table's."""
    rng = np.random.default_rng(5)
    session = ort.InferenceSession(drafter_model("float32", fused_attention, cache, LONGROPE)
                                   .SerializeToString(), providers=["CPUExecutionProvider"])
    table = TARGET_WEIGHTS["model.embed_tokens.weight"]
    lengths = np.array([11, 21], np.int64)
    key, value = (rng.standard_normal((2, C.num_key_value_heads, CAPACITY, C.head_dim))
                  .astype(np.float32) for _ in range(2))
    fused = rng.standard_normal((2, 1, 2 * C.hidden_size)).astype(np.float32)
    positions = (lengths - 1)[:, None]
    mask = (np.arange(CAPACITY)[None] < lengths[:, None]).astype(np.int64)  # [2, capacity]
    feeds = {"inputs_embeds": fused, "position_ids": positions, "shared_kv.key": key,
             "shared_kv.value": value,
             **({"cache_lengths": lengths} if cache == "static" else {"attention_mask": mask})}
    logits = session.run(["logits"], feeds)[0]
    short = replace(LONGROPE, rope_scaling=replace(LONGROPE.rope_scaling, long_factors=None))
    for b in range(2):
        args = (DRAFTER_WEIGHTS, table, fused[b], positions[b], key[b], value[b], mask[b])
        expected = drafter_forward(LONGROPE, *args)[0]
        np.testing.assert_allclose(logits[b], expected, rtol=1e-5, atol=2e-5, err_msg=f"row {b}")
        assert (np.abs(logits[b] - drafter_forward(short, *args)[0]).max() > 1e-3) == (b == 1)


def test_a_static_fused_pair_reads_back_its_drafter_and_converts_back(tmp_path):
    """The fused drafter's extra initializers (the half-width rotary tables) do not leak into
    the weights read back, and converting it to appended caches gives the explicit drafter."""
    from export_models import write_tokenizer

    from speculant_tools.export import convert, read_weights, write_pair_package

    root = write_pair_package(tmp_path / "pair", TARGET_WEIGHTS, C, DRAFTER_WEIGHTS,
                              write_tokenizer(tmp_path / "tokenizer.json"), dtype="float16",
                              cache="static")
    ops = {n.op_type for n in onnx.load(str(root / "assistant" / "model.onnx")).graph.node}
    assert "Attention" in ops
    _, _, drafter_weights = read_weights(root)
    assert drafter_weights.keys() == DRAFTER_WEIGHTS.keys()
    for name, array in DRAFTER_WEIGHTS.items():
        np.testing.assert_array_equal(drafter_weights[name], array.astype(np.float16),
                                      err_msg=name)
    back = convert(root, tmp_path / "appended", "float16", cache="appended")
    ops = {n.op_type for n in onnx.load(str(back / "assistant" / "model.onnx")).graph.node}
    assert "Attention" not in ops and "Softmax" in ops
