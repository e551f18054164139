"""The fixture graphs, built with ``onnx.helper`` from the tables of ``definition``.

Ports use float dtype ``dtype`` (float32 or float16); everything inside is computed in
float32 on exactly representable values, so both dtypes give the same tokens. Batch and
sequence-like axes are symbolic; their names follow the metadata of the distinct-symbol
packages (``sequence``, ``past_sequence``, ``total_sequence``, ``kv_sequence``).
"""

from __future__ import annotations

import numpy as np
import onnx

from builders import definition as fx
from speculant_tools.onnx_build import GraphBuilder

TABLE_NAME = "model.embed_tokens.weight"
CACHE_DIMS = ("batch", fx.NUM_HEADS, "past_sequence", fx.HEAD_DIM)
PRESENT_DIMS = ("batch", fx.NUM_HEADS, "total_sequence", fx.HEAD_DIM)
BORROWED_DIMS = ("batch", fx.NUM_HEADS, "kv_sequence", fx.HEAD_DIM)
NEXT_TABLE_FLAT = fx.next_token_table().reshape(-1)  # [2 * 32 * 33] int64
ROW_STRIDE = fx.NUM_CODES  # flat index = dev * 32 * 33 + cur * 33 + prev_code
DEV_STRIDE = fx.VOCAB_SIZE * fx.NUM_CODES


def _entry_code(g: GraphBuilder, key: str, value: str, head_axis: int, dim_axis: int) -> str:
    """Cache code of entries ``key``/``value`` (float32): the probes averaged, rounded."""
    key_probe = g.pick(g.pick(key, fx.KEY_PROBE[0], head_axis, "key_head"),
                       fx.KEY_PROBE[1], dim_axis - 1, "key_probe")
    value_probe = g.pick(g.pick(value, fx.VALUE_PROBE[0], head_axis, "value_head"),
                         fx.VALUE_PROBE[1], dim_axis - 1, "value_probe")
    key_code = g.op("Div", [key_probe, g.const("key_unit", fx.KEY_PATTERN[fx.KEY_PROBE])])
    value_code = g.op("Div", [value_probe,
                              g.const("value_unit", fx.VALUE_PATTERN[fx.VALUE_PROBE])])
    mean = g.op("Mul", [g.op("Add", [key_code, value_code]), g.const("half", 0.5)], "code_raw")
    return g.op("Round", [mean], "code")


def _token_from_scaled_rows(g: GraphBuilder, scaled: str) -> str:
    """[b, n] float32 token ids (integral, clipped to the vocabulary) from scaled rows
    [b, n, 16]: sum_d (row[d] - 1.75) * 2 * 2**d over the first five columns."""
    bits = g.slice_last(scaled, 0, fx.TOKEN_BITS, 2, "token_bits")  # [b, n, 5]
    centered = g.op("Sub", [bits, g.const("bit_offset", fx.BIT_OFFSET)])
    weights = g.const("bit_weights", fx.BIT_WEIGHTS.reshape(fx.TOKEN_BITS, 1))  # [5, 1]
    token = g.squeeze(g.op("MatMul", [centered, weights], "token_col"), [2], "token_raw")
    return g.round_clip(token, 0, fx.VOCAB_SIZE - 1, "token")  # [b, n]


def _one_hot_logits(g: GraphBuilder, token_ids: str, margin: float, dtype: str) -> str:
    """[b, n, 32] ``dtype``: ``margin`` at the token, 0 elsewhere."""
    depth = g.const("vocab", [fx.VOCAB_SIZE], "int64")
    values = g.const("onehot_values", [0.0, margin])
    return g.from_float32(g.op("OneHot", [token_ids, depth, values], "logits_f32", axis=-1),
                          dtype)


def _next_token(g: GraphBuilder, deviation: str | None, cur: str, prev_code: str) -> str:
    """[b, n] int64 from the next-token table; ``deviation`` None means row 0."""
    cur_idx = g.op("Cast", [cur], "cur_idx", to=onnx.TensorProto.INT64)
    prev_idx = g.op("Cast", [prev_code], "prev_idx", to=onnx.TensorProto.INT64)
    flat = g.op("Add", [g.op("Mul", [cur_idx, g.const("row_stride", ROW_STRIDE, "int64")]),
                        prev_idx], "table_index")
    if deviation is not None:
        flat = g.op("Add", [flat, g.op("Mul", [deviation,
                                               g.const("dev_stride", DEV_STRIDE, "int64")])])
    table = g.initializer("next_token_table", NEXT_TABLE_FLAT)
    return g.op("Gather", [table, flat], "next_token")


def target_graph(spec: fx.FixtureSpec, dtype: str = "float32", *, table_dtype: str | None = None,
                 with_hidden: bool = True, name: str = "target") -> onnx.ModelProto:
    """The target (``with_hidden``) or the greedy decoder (without ``hidden_states``).

    Per position i of the pass (past extent P, n new tokens, i = P + q):
    cur = token decoded from the scaled embedding row; its cache entry code(cur) * pattern
    is appended; prev_code = code read back from the present at index P + q - 1 (a masked
    one-hot reduction: none at index -1, giving 0); next = table[dev(position_ids), cur,
    prev_code]; hidden = [prev_code, +1, 0.5 x6, code(cur), 0.25 x7].
    """
    g = GraphBuilder(name)
    input_ids = g.add_input("input_ids", "int64", ("batch", "sequence"))  # [b, n]
    mask = g.add_input("attention_mask", "int64", ("batch", "total_sequence"))  # [b, T]
    position_ids = g.add_input("position_ids", "int64", ("batch", "sequence"))  # [b, n]
    past_key = g.add_input("past_key_values.0.key", dtype, CACHE_DIMS)  # [b, 2, P, 8]
    past_value = g.add_input("past_key_values.0.value", dtype, CACHE_DIMS)  # [b, 2, P, 8]
    table_dtype = table_dtype or dtype
    table = g.initializer(TABLE_NAME, fx.EMBEDDING_TABLE.astype(table_dtype))  # [32, 16]

    # The current token, through the scaled embedding row (as a real decoder reads it).
    rows = g.to_float32(g.op("Gather", [table, input_ids], "embed_rows"), table_dtype)
    scaled = g.op("Mul", [rows, g.const("embed_scale", fx.EMBEDDING_SCALE)], "embed_scaled")
    cur = _token_from_scaled_rows(g, scaled)  # [b, n] float32
    cur_code = g.op("Add", [cur, g.const("one", 1.0)], "cur_code")  # [b, n]

    # New cache entries, appended after the past: [b, 2, T, 8] with T = P + n.
    code_4d = g.unsqueeze(cur_code, [1, 3], "cur_code_4d")  # [b, 1, n, 1]
    presents = {}
    for port, past, pattern in (("key", past_key, fx.KEY_PATTERN),
                                ("value", past_value, fx.VALUE_PATTERN)):
        pattern_4d = g.const(f"{port}_pattern", pattern.reshape(1, fx.NUM_HEADS, 1, fx.HEAD_DIM))
        new = g.from_float32(g.op("Mul", [code_4d, pattern_4d], f"new_{port}"), dtype)
        presents[port] = g.op("Concat", [past, new], f"present_{port}", axis=2)

    # Read back the previous position's entry: selection [b, 1, n, T] with a one at
    # column P + q - 1 of row q, times the attention mask.
    past_len = g.dim(past_key, 2, "past_len")
    num_new = g.dim(input_ids, 1, "num_new")
    total_len = g.dim(presents["key"], 2, "total_len")
    one = g.const("one_i", 1, "int64")
    zero = g.const("zero_i", 0, "int64")
    first_row = g.op("Sub", [past_len, one], "first_prev_index")
    prev_index = g.op("Range", [first_row, g.op("Add", [first_row, num_new]), one])  # [n]
    columns = g.op("Range", [zero, total_len, one], "columns")  # [T]
    selection = g.op("Cast", [g.op("Equal", [g.unsqueeze(prev_index, [1]),
                                             g.unsqueeze(columns, [0])])],
                     "selection", to=onnx.TensorProto.FLOAT)  # [n, T]
    mask_f = g.unsqueeze(g.op("Cast", [mask], "mask_f", to=onnx.TensorProto.FLOAT), [1])
    selection = g.unsqueeze(g.op("Mul", [selection, mask_f]), [1], "selection_4d")
    prev_entry = {port: g.op("MatMul", [selection, g.to_float32(presents[port], dtype)],
                             f"prev_{port}") for port in presents}  # [b, 2, n, 8]
    prev_code = g.op("Clip", [_entry_code(g, prev_entry["key"], prev_entry["value"], 1, 3),
                              g.const("lo", 0.0), g.const("hi", float(fx.NUM_CODES - 1))],
                     "prev_code")  # [b, n]

    # Deviation flag by position id, then the table lookup.
    clipped_pos = g.op("Clip", [position_ids, zero,
                                g.const("last_pos", spec.max_context - 1, "int64")])
    deviation = g.op("Gather", [g.initializer("deviation_table", spec.deviation_table()),
                                clipped_pos], "deviation")  # [b, n] int64
    next_token = _next_token(g, deviation, cur, prev_code)
    logits = _one_hot_logits(g, next_token, spec.margin, dtype)

    g.add_output("logits", logits, dtype, ("batch", "sequence", fx.VOCAB_SIZE))
    if with_hidden:
        basis_prev = np.eye(fx.CARRY_WIDTH, dtype=np.float32)[fx.CARRY_PREV]
        basis_seed = np.eye(fx.CARRY_WIDTH, dtype=np.float32)[fx.CARRY_SEED]
        target_const = fx.CARRY_PADDING.copy()
        target_const[fx.CARRY_ORIGIN] = fx.ORIGIN_TARGET
        hidden = g.op("Add", [
            g.op("Mul", [g.unsqueeze(prev_code, [2]), g.const("basis_prev", basis_prev)]),
            g.op("Mul", [g.unsqueeze(cur_code, [2]), g.const("basis_seed", basis_seed)])])
        hidden = g.op("Add", [hidden, g.const("carry_const", target_const)], "hidden_f32")
        g.add_output("hidden_states", g.from_float32(hidden, dtype), dtype,
                     ("batch", "sequence", fx.CARRY_WIDTH))
    g.add_output("present.0.key", presents["key"], dtype, PRESENT_DIMS)
    g.add_output("present.0.value", presents["value"], dtype, PRESENT_DIMS)
    return g.model()


BORROWED_KEY = "shared_kv.attention.key"
BORROWED_VALUE = "shared_kv.attention.value"


def drafter_graph(spec: fx.FixtureSpec, dtype: str = "float32",
                  name: str = "assistant") -> onnx.ModelProto:
    """The cacheless drafter. Per row: token = table[0, cur, prev_code] if all four checks
    pass, else ``<unk>`` (0), scored one-hot over ``spec.proposer_width`` ids;
    projected_state = [code(cur), -1, 0.5 x6, carry[8:16]].

    Checks: embedding (all 16 leading values strictly inside (1.5, 2.5)); carry (prev code in
    [0, 32]; origin -1, or origin +1 with seed code == code(cur)); borrowed cache (the entry at
    the cache's index extent - 1, by a masked reduction that reads zeros from an empty cache,
    has code == seed code >= 1); position (position id == attention-mask length - 1).
    """
    g = GraphBuilder(name)
    fused = g.add_input("inputs_embeds", dtype, ("batch", "sequence", fx.FUSED_WIDTH))
    position_ids = g.add_input("position_ids", "int64", ("batch", "sequence"))  # [b, n]
    mask = g.add_input("attention_mask", "int64", ("batch", "kv_sequence"))  # [b, K]
    key = g.add_input(BORROWED_KEY, dtype, BORROWED_DIMS)  # [b, 2, K, 8]
    value = g.add_input(BORROWED_VALUE, dtype, BORROWED_DIMS)  # [b, 2, K, 8]

    fused32 = g.to_float32(fused, dtype)
    embedded = g.slice_last(fused32, 0, fx.EMBED_WIDTH, 2, "embedded")  # [b, n, 16]
    carry = g.slice_last(fused32, fx.EMBED_WIDTH, fx.FUSED_WIDTH, 2, "carry")  # [b, n, 16]

    # 1. embedding band
    in_band = g.op("And", [g.op("Greater", [embedded, g.const("band_low", fx.BAND_LOW)]),
                           g.op("Less", [embedded, g.const("band_high", fx.BAND_HIGH)])])
    band_min = g.op("ReduceMin", [g.op("Cast", [in_band], to=onnx.TensorProto.FLOAT)],
                    "band_min", axes=[2], keepdims=0)  # [b, n]
    embedding_ok = g.op("Greater", [band_min, g.const("half", 0.5)], "embedding_ok")
    cur = _token_from_scaled_rows(g, embedded)  # [b, n]
    cur_code = g.op("Add", [cur, g.const("one", 1.0)], "cur_code")

    # 2. carry
    prev_code = g.pick(carry, fx.CARRY_PREV, 2, "carry_prev")  # [b, n]
    origin = g.pick(carry, fx.CARRY_ORIGIN, 2, "carry_origin")
    seed_code = g.pick(carry, fx.CARRY_SEED, 2, "carry_seed")
    prev_in_range = g.op("And", [
        g.op("GreaterOrEqual", [prev_code, g.const("zero", 0.0)]),
        g.op("LessOrEqual", [prev_code, g.const("max_code", float(fx.NUM_CODES - 1))])])
    from_target = g.op("And", [
        g.op("Equal", [origin, g.const("origin_target", fx.ORIGIN_TARGET)]),
        g.op("Equal", [seed_code, cur_code])], "bootstrap_consistent")
    from_drafter = g.op("Equal", [origin, g.const("origin_drafter", fx.ORIGIN_DRAFTER)])
    carry_ok = g.op("And", [prev_in_range, g.op("Or", [from_target, from_drafter])],
                    "carry_ok")

    # 3. borrowed cache: the entry at the cache's own last index (extent - 1), read as a
    # reduction under a one-hot position mask. A zero entry is put in front first, so the
    # reduced axis is never empty and an empty cache reads as that zero entry.
    zero_entry_shape = g.op("Concat", [g.op("Shape", [key], "batch_dim", start=0, end=1),
                                       g.const("entry_dims", [fx.NUM_HEADS, 1, fx.HEAD_DIM],
                                               "int64")], "zero_entry_shape", axis=0)
    zero_entry = g.op("ConstantOfShape", [zero_entry_shape], "zero_entry",
                      value=onnx.helper.make_tensor("zero", onnx.TensorProto.FLOAT, [1], [0.0]))
    kv_len = g.dim(key, 2, "kv_len")  # K; the padded axis has K + 1 entries
    columns = g.op("Range", [g.const("zero_i", 0, "int64"),
                             g.op("Add", [kv_len, g.const("one_i", 1, "int64")]),
                             g.const("one_i", 1, "int64")], "columns")  # [K + 1]
    selection = g.op("Cast", [g.op("Equal", [columns, kv_len])], "selection",
                     to=onnx.TensorProto.FLOAT)  # [K + 1]: one-hot at the last entry
    selection = g.unsqueeze(selection, [0, 1, 3], "selection_4d")  # [1, 1, K + 1, 1]
    axis2 = g.const("axis2", [2], "int64")
    last_entry = {}
    for port, cache in (("key", key), ("value", value)):
        padded = g.op("Concat", [zero_entry, g.to_float32(cache, dtype)], f"padded_{port}",
                      axis=2)  # [b, 2, K + 1, 8]
        last_entry[port] = g.op("ReduceSum", [g.op("Mul", [padded, selection]), axis2],
                                f"last_{port}", keepdims=0)  # [b, 2, 8]
    cache_code = g.unsqueeze(_entry_code(g, last_entry["key"], last_entry["value"], 1, 2),
                             [1], "cache_code")  # [b, 1]
    cache_ok = g.op("And", [g.op("Equal", [cache_code, seed_code]),
                            g.op("GreaterOrEqual", [seed_code, g.const("one", 1.0)])],
                    "cache_ok")

    # 4. position
    mask_len = g.op("Shape", [mask], "mask_len", start=1, end=2)  # [1]
    position_ok = g.op("Equal", [position_ids, g.op("Sub", [mask_len,
                                                            g.const("one_i", 1, "int64")])],
                       "position_ok")

    all_ok = g.op("And", [g.op("And", [embedding_ok, carry_ok]),
                          g.op("And", [cache_ok, position_ok])], "all_checks")
    prev_clipped = g.round_clip(prev_code, 0, fx.NUM_CODES - 1, "prev_clipped")
    prediction = _next_token(g, None, cur, prev_clipped)
    token = g.op("Where", [all_ok, prediction, g.const("wrong_token", fx.UNK_ID, "int64")],
                 "draft_token")
    logits = _one_hot_logits(g, token, spec.margin, dtype)  # [b, n, 32]
    if spec.proposer_vocab_size is not None:  # a subset: the first N ids only
        logits = g.slice_last(logits, 0, spec.proposer_vocab_size, 2, "subset_logits")
    if spec.proposer_vocab_map is not None:  # mapped: those columns only
        logits = g.op("Gather", [logits, g.const("vocab_map", spec.proposer_vocab_map, "int64")],
                      "mapped_logits", axis=2)
    g.add_output("logits", logits, dtype, ("batch", "sequence", spec.proposer_width))

    basis_prev = np.eye(fx.CARRY_WIDTH // 2, dtype=np.float32)[fx.CARRY_PREV]
    prev_half_const = fx.CARRY_PADDING[:fx.CARRY_WIDTH // 2].copy()
    prev_half_const[fx.CARRY_ORIGIN] = fx.ORIGIN_DRAFTER
    prev_half = g.op("Add", [g.op("Mul", [g.unsqueeze(cur_code, [2]),
                                          g.const("basis_prev", basis_prev)]),
                             g.const("prev_half_const", prev_half_const)], "prev_half")
    seed_half = g.slice_last(carry, fx.CARRY_WIDTH // 2, fx.CARRY_WIDTH, 2, "seed_half")
    projected = g.op("Concat", [prev_half, seed_half], "projected_f32", axis=2)
    g.add_output("projected_state", g.from_float32(projected, dtype), dtype,
                 ("batch", "sequence", fx.CARRY_WIDTH))
    return g.model()
