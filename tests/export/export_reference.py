"""The exported architecture in plain numpy (float64), written from its description, not from
the graph builder: the oracle the ONNX graphs are compared with. One sequence, no batch axis.
``target_forward`` follows every declared variation of the configuration (the families of
docs/models.md): q/k/v and o biases, QK norms, RoPE scaling (linear, llama3, per-frequency
factors), sliding layers with their own RoPE base, Gemma's scaled embeddings, (1 + w) and
sandwich norms, GeGLU, soft caps and attention scale, an untied LM head.

    logits, hidden, keys, values = target_forward(config, weights, ids)       # from empty
    logits, state = drafter_forward(config, drafter_weights, table, fused, position, k, v, mask)
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from speculant_tools.export import LlamaConfig
from speculant_tools.export.config import VARIATIONS


def _w(weights, name: str) -> np.ndarray:
    return np.asarray(weights[name], dtype=np.float64)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def inverse_frequencies(config: LlamaConfig, is_long: bool = False) -> np.ndarray:
    """RoPE's ``[d / 2]`` inverse frequencies, rescaled as ``config.rope_scaling`` says:
    linear divides all by the factor; llama3 (Meta's Llama 3.1 reference) divides those whose
    wavelength exceeds original / low_freq_factor by the factor, keeps those under
    original / high_freq_factor and blends in between; factors and longrope divide one by
    one (``is_long``: by longrope's long factors)."""
    d, scaling = config.rotary_dim or config.head_dim, config.rope_scaling  # rotated values
    inv_freq = 1.0 / config.rope_theta ** (np.arange(0, d, 2) / d)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type in ("factors", "longrope"):
        factors = scaling.long_factors if is_long else scaling.frequency_factors
        return inv_freq / np.asarray(factors, np.float64)
    wavelength = 2 * np.pi / inv_freq
    original = scaling.original_max_position_embeddings
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    return np.where(wavelength < original / high, inv_freq,
                    np.where(wavelength > original / low, inv_freq / scaling.factor, blended))


def rope(x: np.ndarray, positions: np.ndarray, config: LlamaConfig,
         is_long: np.ndarray | None = None) -> np.ndarray:
    """``x`` [heads, s, d] rotated at ``positions`` [s] (halves layout, as HF Llama), times
    longrope's attention factor (LongRoPE scales cos and sin by it); with ``rotary_dim``
    (partial rotary) the first rotary_dim values so, the rest as they are. ``is_long`` [s]
    bool: the positions rotated with longrope's long factors (default none)."""
    r, scaling = config.rotary_dim or config.head_dim, config.rope_scaling
    is_long = np.zeros(len(positions), bool) if is_long is None else np.asarray(is_long)
    angles = np.outer(positions, inverse_frequencies(config))
    if is_long.any():
        angles = np.where(is_long[:, None],
                          np.outer(positions, inverse_frequencies(config, True)), angles)
    angles = np.concatenate([angles, angles], axis=-1)  # [s, r]
    turned, passed = x[..., :r], x[..., r:]
    x1, x2 = turned[..., : r // 2], turned[..., r // 2:]
    factor = scaling.attention_factor if scaling and scaling.rope_type == "longrope" else 1.0
    roped = turned * np.cos(angles) + np.concatenate([-x2, x1], axis=-1) * np.sin(angles)
    return np.concatenate([factor * roped, passed], axis=-1)


def soft_cap(x: np.ndarray, cap: float | None) -> np.ndarray:
    return x if cap is None else cap * np.tanh(x / cap)


def attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, visible: np.ndarray,
           config: LlamaConfig) -> np.ndarray:
    """q [H, s, d]; keys/values [KV, T, d]; visible [s, T] bool -> [s, H * d]. Scores scaled
    by ``query_pre_attn_scalar ** -0.5`` (default head_dim), then soft-capped."""
    groups = config.num_attention_heads // config.num_key_value_heads
    k = np.repeat(keys, groups, axis=0)  # head h reads KV head h // groups
    v = np.repeat(values, groups, axis=0)
    scalar = config.query_pre_attn_scalar or config.head_dim
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(scalar)  # [H, s, T]
    scores = soft_cap(scores, config.attn_logit_softcapping)
    scores = np.where(visible[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    return (probs @ v).transpose(1, 0, 2).reshape(q.shape[1], -1)


def mlp(h: np.ndarray, weights, prefix: str, act: str = "silu") -> np.ndarray:
    gate = h @ _w(weights, f"{prefix}.mlp.gate_proj.weight").T
    up = h @ _w(weights, f"{prefix}.mlp.up_proj.weight").T
    if act == "gelu_pytorch_tanh":  # GELU's tanh approximation
        gate = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
    else:
        gate = gate / (1 + np.exp(-gate))
    return (gate * up) @ _w(weights, f"{prefix}.mlp.down_proj.weight").T


def split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    return x.reshape(x.shape[0], heads, -1).transpose(1, 0, 2)  # [heads, s, d]


def projection(h: np.ndarray, weights, name: str, has_bias: bool) -> np.ndarray:
    """``h @ W.T`` (+ b where the config declares the bias)."""
    out = h @ _w(weights, f"{name}.weight").T
    return out + _w(weights, f"{name}.bias") if has_bias else out


def long_positions(config: LlamaConfig, blocks: list[int]) -> np.ndarray:
    """[sum(blocks)] bool: the positions a run of forward calls of ``blocks`` tokens each
    rotates with longrope's long factors: those of every call whose sequence (its last
    position + 1) is longer than ``original_max_position_embeddings``, where the config has
    long factors (transformers' ``longrope_frequency_update``; cached keys keep theirs)."""
    scaling = config.rope_scaling
    ends = np.repeat(np.cumsum(blocks), blocks)
    if scaling is None or getattr(scaling, "long_factors", None) is None:
        return np.zeros(len(ends), bool)
    return ends > scaling.original_max_position_embeddings


def target_forward(config: LlamaConfig, weights, ids, mask=None, blocks=None):
    """The whole sequence ``ids`` from empty caches. ``mask`` [T] (1 = visible, default all).
    ``blocks``: the sizes of the forward calls that computed it (default one call; they
    choose longrope's table: :func:`long_positions`). Returns logits [T, V], hidden [T, H]
    (after the final norm) and per layer keys (rotated) and values [KV, T, d]."""
    c, eps = config, config.rms_norm_eps
    ids = np.asarray(ids)
    n = len(ids)
    positions = np.arange(n)
    is_long = long_positions(c, [n] if blocks is None else blocks)
    visible = positions[None, :] <= positions[:, None]
    if mask is not None:
        visible = visible & (np.asarray(mask)[None, :] == 1)
    if c.sliding_window is not None:  # a sliding layer's query sees its last `window` keys
        recent = visible & (positions[None, :] > positions[:, None] - c.sliding_window)
    local = c if c.rope_local_base_freq is None else replace(
        c, rope_theta=c.rope_local_base_freq, rope_scaling=None)  # unscaled local RoPE

    def norm(x, name):  # RMSNorm scaled by (offset + w): Gemma's 1 + w
        return rms_norm(x, c.norm_weight_offset + _w(weights, name), eps)

    table = _w(weights, "model.embed_tokens.weight")
    x = table[ids] * float(np.float32(c.embedding_multiplier))  # rounded, as the graph's
    keys, values = [], []
    for i, is_sliding in enumerate(c.sliding_layers):
        p, a = f"model.layers.{i}", f"model.layers.{i}.self_attn"
        h = norm(x, f"{p}.input_layernorm.weight")
        q = split_heads(projection(h, weights, f"{a}.q_proj", c.attention_bias),
                        c.num_attention_heads)
        k = split_heads(projection(h, weights, f"{a}.k_proj", c.attention_bias),
                        c.num_key_value_heads)
        if c.qk_norm:  # per head, over head_dim
            q, k = norm(q, f"{a}.q_norm.weight"), norm(k, f"{a}.k_norm.weight")
        layer_rope = local if is_sliding else c
        q, k = (rope(x, positions, layer_rope, is_long) for x in (q, k))
        v = split_heads(projection(h, weights, f"{a}.v_proj", c.attention_bias),
                        c.num_key_value_heads)
        keys.append(k)
        values.append(v)
        context = attend(q, k, v, recent if is_sliding else visible, c)
        out = projection(context, weights, f"{a}.o_proj", c.attention_output_bias)
        if c.post_norms:  # Gemma's sandwich: each branch normed before it is added
            x = x + norm(out, f"{p}.post_attention_layernorm.weight")
            out = mlp(norm(x, f"{p}.pre_feedforward_layernorm.weight"), weights, p,
                      c.hidden_act)
            x = x + norm(out, f"{p}.post_feedforward_layernorm.weight")
        else:
            x = x + out
            x = x + mlp(norm(x, f"{p}.post_attention_layernorm.weight"), weights, p,
                        c.hidden_act)
    hidden = norm(x, "model.norm.weight")
    head = table if c.tie_word_embeddings else _w(weights, "lm_head.weight")
    return soft_cap(hidden @ head.T, c.final_logit_softcapping), hidden, keys, values


def drafter_forward(config: LlamaConfig, weights, table, fused, positions, keys, values,
                    mask):
    """fused [s, 2H]; positions [s]; keys/values [KV, K, d] (borrowed, keys rotated);
    mask [K]. Every query sees every key whose mask entry is 1. Returns logits [s, V] and
    the projected state [s, H]. The layer is plain Llama whatever the target's variations,
    rotating with its RoPE (``rope_scaling`` and ``rotary_dim`` kept; longrope's table as
    one call ending at ``max(positions) + 1`` takes it)."""
    c, eps, p = replace(config, **VARIATIONS), config.rms_norm_eps, "drafter.layer"
    x = np.asarray(fused, np.float64) @ _w(weights, "drafter.in_proj.weight").T
    h = rms_norm(x, _w(weights, f"{p}.input_layernorm.weight"), eps)
    positions = np.asarray(positions)
    is_long = long_positions(c, [max(positions) + 1])[-1:].repeat(len(positions))
    q = rope(split_heads(h @ _w(weights, f"{p}.self_attn.q_proj.weight").T,
                         c.num_attention_heads), positions, c, is_long)
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
