"""The fixture graphs in numpy, written from ``definition`` (never by running ONNX Runtime).

``target_forward`` and ``drafter_forward`` take the same arrays the ONNX graphs take
(any float dtype; computed in float32 as the graphs do) and return float32 outputs; cast
them to the port dtype to compare with a float16 graph. They accept wrong inputs too (a
stale cache, an unscaled row, ...), so tests can predict what a miswired runtime would get.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from builders import definition as fx

NEXT_TABLE = fx.next_token_table()  # [2, 32, 33] int64


@dataclass(frozen=True)
class TargetOutputs:
    logits: np.ndarray  # [b, n, 32] float32
    hidden_states: np.ndarray  # [b, n, 16] float32
    present_key: np.ndarray  # [b, 2, P + n, 8] in the past's dtype
    present_value: np.ndarray  # [b, 2, P + n, 8] in the past's dtype
    next_tokens: np.ndarray  # [b, n] int64, argmax of logits


@dataclass(frozen=True)
class DrafterOutputs:
    logits: np.ndarray  # [b, n, N] float32 (N = spec.proposer_width)
    projected_state: np.ndarray  # [b, n, 16] float32
    tokens: np.ndarray  # [b, n] int64, argmax of logits
    checks: dict[str, np.ndarray]  # check name -> [b, n] bool; all true = prediction used


def _one_hot(tokens: np.ndarray, margin: float) -> np.ndarray:
    return (np.eye(fx.VOCAB_SIZE, dtype=np.float32)[tokens] * np.float32(margin))


def _token_from_scaled_rows(scaled: np.ndarray) -> np.ndarray:
    """[..., 16] float32 -> [...] float32 token ids, rounded and clipped as the graphs do."""
    centered = scaled[..., :fx.TOKEN_BITS] - np.float32(fx.BIT_OFFSET)
    return np.clip(np.round(centered @ fx.BIT_WEIGHTS), 0, fx.VOCAB_SIZE - 1)


def _entry_code(key: np.ndarray, value: np.ndarray) -> np.ndarray:
    """key/value [..., 2, 8] float32 -> [...] rounded cache code (not clipped)."""
    k = key[..., fx.KEY_PROBE[0], fx.KEY_PROBE[1]] / fx.KEY_PATTERN[fx.KEY_PROBE]
    v = value[..., fx.VALUE_PROBE[0], fx.VALUE_PROBE[1]] / fx.VALUE_PATTERN[fx.VALUE_PROBE]
    return np.round((k + v) * np.float32(0.5))


def target_forward(spec: fx.FixtureSpec, input_ids: np.ndarray, position_ids: np.ndarray,
                   attention_mask: np.ndarray, past_key: np.ndarray, past_value: np.ndarray,
                   table: np.ndarray = fx.EMBEDDING_TABLE) -> TargetOutputs:
    """One pass of the target graph. input_ids/position_ids [b, n] int64, attention_mask
    [b, P + n] int64, past_key/past_value [b, 2, P, 8]; ``table`` [32, 16] as stored."""
    dtype = past_key.dtype
    scaled = table[input_ids].astype(np.float32) * np.float32(fx.EMBEDDING_SCALE)  # [b, n, 16]
    cur = _token_from_scaled_rows(scaled)  # [b, n]
    cur_code = cur + np.float32(1)
    code_4d = cur_code[:, None, :, None]  # [b, 1, n, 1]
    present_key = np.concatenate([past_key, (code_4d * fx.KEY_PATTERN[None, :, None, :])
                                  .astype(dtype)], axis=2)
    present_value = np.concatenate([past_value, (code_4d * fx.VALUE_PATTERN[None, :, None, :])
                                    .astype(dtype)], axis=2)

    past_len, num_new, total = past_key.shape[2], input_ids.shape[1], present_key.shape[2]
    prev_index = np.arange(past_len - 1, past_len - 1 + num_new)  # [n]
    selection = (prev_index[:, None] == np.arange(total)[None, :]).astype(np.float32)  # [n, T]
    selection = selection[None] * attention_mask.astype(np.float32)[:, None, :]  # [b, n, T]
    selection = selection[:, None]  # [b, 1, n, T]
    prev_key = selection @ present_key.astype(np.float32)  # [b, 2, n, 8]
    prev_value = selection @ present_value.astype(np.float32)
    prev_code = np.clip(_entry_code(np.moveaxis(prev_key, 1, 2), np.moveaxis(prev_value, 1, 2)),
                        0, fx.NUM_CODES - 1)  # [b, n]

    deviation = spec.deviation_table()[np.clip(position_ids, 0, spec.max_context - 1)]
    next_tokens = NEXT_TABLE[deviation, cur.astype(np.int64), prev_code.astype(np.int64)]
    hidden = np.broadcast_to(fx.CARRY_PADDING, cur.shape + (fx.CARRY_WIDTH,)).copy()
    hidden[..., fx.CARRY_PREV] = prev_code
    hidden[..., fx.CARRY_ORIGIN] = fx.ORIGIN_TARGET
    hidden[..., fx.CARRY_SEED] = cur_code
    return TargetOutputs(_one_hot(next_tokens, spec.margin), hidden, present_key,
                         present_value, next_tokens)


def drafter_forward(spec: fx.FixtureSpec, inputs_embeds: np.ndarray, position_ids: np.ndarray,
                    attention_mask: np.ndarray, key: np.ndarray,
                    value: np.ndarray) -> DrafterOutputs:
    """One invocation of the drafter graph. inputs_embeds [b, n, 32], position_ids [b, n]
    int64, attention_mask [b, K] int64, key/value [b, 2, K, 8] (the borrowed cache)."""
    fused = inputs_embeds.astype(np.float32)
    embedded, carry = fused[..., :fx.EMBED_WIDTH], fused[..., fx.EMBED_WIDTH:]
    embedding_ok = np.all((embedded > fx.BAND_LOW) & (embedded < fx.BAND_HIGH), axis=-1)
    cur = _token_from_scaled_rows(embedded)  # [b, n]
    cur_code = cur + np.float32(1)

    prev_code, origin = carry[..., fx.CARRY_PREV], carry[..., fx.CARRY_ORIGIN]
    seed_code = carry[..., fx.CARRY_SEED]
    carry_ok = ((prev_code >= 0) & (prev_code <= fx.NUM_CODES - 1)
                & ((origin == fx.ORIGIN_DRAFTER)
                   | ((origin == fx.ORIGIN_TARGET) & (seed_code == cur_code))))

    # A zero entry in front, then a one-hot reduction at the last index: extent - 1 of the
    # cache itself, or the zero entry when the cache is empty.
    pad = np.zeros(key.shape[:2] + (1,) + key.shape[3:], np.float32)
    padded_key = np.concatenate([pad, key.astype(np.float32)], axis=2)  # [b, 2, K + 1, 8]
    padded_value = np.concatenate([pad, value.astype(np.float32)], axis=2)
    selection = (np.arange(key.shape[2] + 1) == key.shape[2]).astype(np.float32)
    selection = selection[None, None, :, None]  # [1, 1, K + 1, 1]
    last_key = (padded_key * selection).sum(axis=2)  # [b, 2, 8]
    last_value = (padded_value * selection).sum(axis=2)
    cache_code = _entry_code(last_key, last_value)[:, None]  # [b, 1]
    cache_ok = (cache_code == seed_code) & (seed_code >= 1)

    position_ok = position_ids == attention_mask.shape[1] - 1
    checks = {"embedding": embedding_ok, "carry": np.broadcast_to(carry_ok, cur.shape),
              "borrowed_cache": np.broadcast_to(cache_ok, cur.shape),
              "position": np.broadcast_to(position_ok, cur.shape)}
    all_ok = embedding_ok & carry_ok & cache_ok & position_ok
    prev_idx = np.clip(np.round(prev_code), 0, fx.NUM_CODES - 1).astype(np.int64)
    prediction = NEXT_TABLE[0, cur.astype(np.int64), prev_idx]
    tokens = np.where(all_ok, prediction, fx.UNK_ID).astype(np.int64)
    if spec.proposer_vocab_map is not None:  # mapped: the map's columns; else its first id
        ids = np.asarray(spec.proposer_vocab_map, np.int64)
        logits = _one_hot(tokens, spec.margin)[..., ids]
        tokens = np.where(np.isin(tokens, ids), tokens, ids[0])
    else:
        width = spec.proposer_width  # a subset: the first `width` columns of the one-hot row
        logits = _one_hot(tokens, spec.margin)[..., :width]
        tokens = np.where(tokens < width, tokens, fx.UNK_ID)  # the argmax of zeros: id 0

    projected = np.concatenate([np.zeros_like(carry[..., :fx.CARRY_WIDTH // 2]),
                                carry[..., fx.CARRY_WIDTH // 2:]], axis=-1)
    projected[..., :fx.CARRY_WIDTH // 2] = fx.CARRY_PADDING[:fx.CARRY_WIDTH // 2]
    projected[..., fx.CARRY_PREV] = cur_code
    projected[..., fx.CARRY_ORIGIN] = fx.ORIGIN_DRAFTER
    return DrafterOutputs(logits, projected, tokens, checks)


# -- convenience: the inputs a correct runtime builds --------------------------------------
def empty_cache(dtype: str = "float32") -> np.ndarray:
    """[1, 2, 0, 8]: a runtime-managed cell before the first pass."""
    return np.zeros((1, fx.NUM_HEADS, 0, fx.HEAD_DIM), dtype)


def cache_for(tokens: list[int], dtype: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    """(key, value) [1, 2, len(tokens), 8]: the cells after consuming ``tokens``."""
    key = np.zeros((1, fx.NUM_HEADS, len(tokens), fx.HEAD_DIM), np.float32)
    value = np.zeros_like(key)
    for i, token in enumerate(tokens):
        key[0, :, i], value[0, :, i] = fx.cache_entry(token)
    return key.astype(dtype), value.astype(dtype)


def scaled_row(token: int, dtype: str = "float32", times: int = 1) -> np.ndarray:
    """[16]: the table row of ``token`` scaled ``times`` times (1 = what the chain feeds)."""
    row = fx.EMBEDDING_TABLE[token].astype(dtype)
    scale = np.float32(np.dtype(dtype).type(fx.EMBEDDING_SCALE))
    for _ in range(times):
        row = (row.astype(np.float32) * scale).astype(dtype)
    return row


def scaled_table(dtype: str = "float32") -> np.ndarray:
    """[32, 16]: the table as the chain must hold it, scaled once in the currency
    (runtime.md §9.3: round_currency(f32(element) * f32(round_currency(scale))))."""
    table = fx.EMBEDDING_TABLE.astype(dtype)
    scale = np.float32(np.dtype(dtype).type(fx.EMBEDDING_SCALE))
    return (table.astype(np.float32) * scale).astype(dtype)


def fused_input(token: int, carry: np.ndarray, dtype: str = "float32") -> np.ndarray:
    """[1, 1, 32]: concat(scaled table row of ``token``, ``carry`` [16])."""
    fused = np.concatenate([scaled_row(token, dtype), carry.astype(dtype).reshape(-1)])
    return fused.reshape(1, 1, fx.FUSED_WIDTH)
