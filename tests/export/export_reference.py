"""The exported architecture in plain numpy (float64), written from its description, not from
the graph builder: the oracle the ONNX graphs are compared with. One sequence, no batch axis.

    logits, hidden, keys, values = target_forward(config, weights, ids)       # from empty
    logits, state = drafter_forward(config, drafter_weights, table, fused, position, k, v, mask)
"""

from __future__ import annotations

import numpy as np

from speculant_tools.export import LlamaConfig


def _w(weights, name: str) -> np.ndarray:
    return np.asarray(weights[name], dtype=np.float64)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rope(x: np.ndarray, positions: np.ndarray, config: LlamaConfig) -> np.ndarray:
    """``x`` [heads, s, d] rotated at ``positions`` [s] (halves layout, as HF Llama)."""
    d = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (np.arange(0, d, 2) / d)
    angles = np.outer(positions, inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)  # [s, d]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * np.cos(angles) + np.concatenate([-x2, x1], axis=-1) * np.sin(angles)


def attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, visible: np.ndarray,
           config: LlamaConfig) -> np.ndarray:
    """q [H, s, d]; keys/values [KV, T, d]; visible [s, T] bool -> [s, H * d]."""
    groups = config.num_attention_heads // config.num_key_value_heads
    k = np.repeat(keys, groups, axis=0)  # head h reads KV head h // groups
    v = np.repeat(values, groups, axis=0)
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(config.head_dim)  # [H, s, T]
    scores = np.where(visible[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    return (probs @ v).transpose(1, 0, 2).reshape(q.shape[1], -1)


def mlp(h: np.ndarray, weights, prefix: str) -> np.ndarray:
    gate = h @ _w(weights, f"{prefix}.mlp.gate_proj.weight").T
    up = h @ _w(weights, f"{prefix}.mlp.up_proj.weight").T
    return (gate / (1 + np.exp(-gate)) * up) @ _w(weights, f"{prefix}.mlp.down_proj.weight").T


def split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    return x.reshape(x.shape[0], heads, -1).transpose(1, 0, 2)  # [heads, s, d]


def target_forward(config: LlamaConfig, weights, ids, mask=None):
    """The whole sequence ``ids`` from empty caches. ``mask`` [T] (1 = visible, default all).
    Returns logits [T, V], hidden [T, H] (after the final norm) and per layer keys (rotated)
    and values [KV, T, d]."""
    c, eps = config, config.rms_norm_eps
    ids = np.asarray(ids)
    n = len(ids)
    positions = np.arange(n)
    visible = positions[None, :] <= positions[:, None]
    if mask is not None:
        visible = visible & (np.asarray(mask)[None, :] == 1)
    table = _w(weights, "model.embed_tokens.weight")
    x = table[ids]
    keys, values = [], []
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        h = rms_norm(x, _w(weights, f"{p}.input_layernorm.weight"), eps)
        q = rope(split_heads(h @ _w(weights, f"{p}.self_attn.q_proj.weight").T,
                             c.num_attention_heads), positions, c)
        k = rope(split_heads(h @ _w(weights, f"{p}.self_attn.k_proj.weight").T,
                             c.num_key_value_heads), positions, c)
        v = split_heads(h @ _w(weights, f"{p}.self_attn.v_proj.weight").T,
                        c.num_key_value_heads)
        keys.append(k)
        values.append(v)
        x = x + attend(q, k, v, visible, c) @ _w(weights, f"{p}.self_attn.o_proj.weight").T
        x = x + mlp(rms_norm(x, _w(weights, f"{p}.post_attention_layernorm.weight"), eps),
                    weights, p)
    hidden = rms_norm(x, _w(weights, "model.norm.weight"), eps)
    return hidden @ table.T, hidden, keys, values


def drafter_forward(config: LlamaConfig, weights, table, fused, positions, keys, values,
                    mask):
    """fused [s, 2H]; positions [s]; keys/values [KV, K, d] (borrowed, keys rotated);
    mask [K]. Every query sees every key whose mask entry is 1. Returns logits [s, V] and
    the projected state [s, H]."""
    c, eps, p = config, config.rms_norm_eps, "drafter.layer"
    x = np.asarray(fused, np.float64) @ _w(weights, "drafter.in_proj.weight").T
    h = rms_norm(x, _w(weights, f"{p}.input_layernorm.weight"), eps)
    q = rope(split_heads(h @ _w(weights, f"{p}.self_attn.q_proj.weight").T,
                         c.num_attention_heads), np.asarray(positions), c)
    visible = np.broadcast_to(np.asarray(mask)[None, :] == 1, (len(x), len(mask)))
    x = x + attend(q, np.asarray(keys, np.float64), np.asarray(values, np.float64), visible,
                   c) @ _w(weights, f"{p}.self_attn.o_proj.weight").T
    x = x + mlp(rms_norm(x, _w(weights, f"{p}.post_attention_layernorm.weight"), eps),
                weights, p)
    state = rms_norm(x, _w(weights, "drafter.norm.weight"), eps)
    return state @ np.asarray(table, np.float64).T, state


def greedy(config: LlamaConfig, weights, prompt, max_new_tokens: int):
    """Full-recompute greedy continuation and the smallest top-2 logit margin on its path."""
    ids, margin = list(prompt), np.inf
    for _ in range(max_new_tokens):
        row = target_forward(config, weights, ids)[0][-1]
        top = np.sort(row)[-2:]
        margin = min(margin, top[1] - top[0])
        ids.append(int(np.argmax(row)))
    return ids[len(prompt):], margin
