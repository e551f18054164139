"""The target in PyTorch: a Llama forward over the exporter's weights (no transformers).

    target = TorchLlama(config, weights).to(device)       # frozen, float32 (or .to(bfloat16))
    state = target.features(ids)      # h [B, T, H] after the final norm; k, v: last layer's
    state = target.features(ids, streams=(2, 15, 30))   # and those residual streams
    logits = state.hidden @ target.embed.t()

Conventions, the same as the exported ONNX graphs (``speculant_tools.export.graphs``) and
Hugging Face's ``LlamaForCausalLM``:

* RMSNorm: ``w * (x32 * rsqrt(mean(x32 ** 2) + eps)).to(x.dtype)``.
* RoPE, rotate-half: ``inv_freq[i] = theta ** (-2i / d)``, ``angle = position * inv_freq``,
  ``rope(x) = x * cos(cat(angle, angle)) + cat(-x[d/2:], x[:d/2]) * sin(cat(angle, angle))``.
* Grouped-query attention: query head ``h`` reads KV head ``h // (heads / kv_heads)``,
  scale ``1 / sqrt(head_dim)``; causal.
* Tied embeddings: the LM head is ``model.embed_tokens.weight``.

The last layer's keys (after RoPE) and values are what the chained drafter borrows
(``docs/design/chained.md``); the hidden state after the final norm is its carry seed, or,
with EAGLE-3's fused seed, the residual streams ``features(ids, streams=...)`` returns are
(residual stream ``i``: the one entering layer ``i``; ``num_hidden_layers``: the last layer's
output, before the final norm: the exported graphs' ``seed_output`` numbering).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from speculant_tools.export import LlamaConfig
from speculant_tools.export.config import EMBEDDING


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [*positions.shape, head_dim] float32."""
    exponent = torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim
    angle = positions.float()[..., None] * (1.0 / theta ** exponent)
    angle = torch.cat([angle, angle], dim=-1)
    return angle.cos(), angle.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, d]; cos, sin broadcastable to it."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, kv_heads, T, d] -> [B, kv_heads * groups, T, d] (HF ``repeat_kv``)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


@dataclass
class Features:
    """What one causal pass over ``ids`` [B, T] gives the drafter."""

    hidden: torch.Tensor  # [B, T, H] after the final norm: the carry seed at every position
    keys: torch.Tensor  # [B, kv_heads, T, head_dim] the last layer's keys, after RoPE
    values: torch.Tensor  # [B, kv_heads, T, head_dim] the last layer's values
    streams: tuple[torch.Tensor, ...] = ()  # each [B, T, H]: the residual streams asked for


class LlamaLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        q, kv, f = config.num_attention_heads * d, config.num_key_value_heads * d, \
            config.intermediate_size
        self.input_layernorm = nn.Parameter(torch.ones(h))
        self.q_proj, self.k_proj = nn.Linear(h, q, bias=False), nn.Linear(h, kv, bias=False)
        self.v_proj, self.o_proj = nn.Linear(h, kv, bias=False), nn.Linear(q, h, bias=False)
        self.post_attention_layernorm = nn.Parameter(torch.ones(h))
        self.gate_proj, self.up_proj = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def mlp(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        n = rms_norm(x, self.post_attention_layernorm, eps)
        return x + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n))


class TorchLlama(nn.Module):
    """A frozen ``LlamaForCausalLM`` (tied embeddings) built from the exporter's weights."""

    def __init__(self, config: LlamaConfig, weights: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Parameter(torch.zeros(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(LlamaLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size))
        self.load_weights(weights)
        self.requires_grad_(False)
        self.eval()

    @property
    def eps(self) -> float:
        return self.config.rms_norm_eps

    @property
    def groups(self) -> int:
        return self.config.num_groups

    @torch.no_grad()
    def load_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Copy ``weights`` (HF names, ``target_shapes``) into the parameters."""
        def put(parameter: torch.Tensor, name: str) -> None:
            parameter.copy_(torch.from_numpy(np.array(weights[name], np.float32)))

        put(self.embed, EMBEDDING)
        put(self.norm, "model.norm.weight")
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            put(layer.input_layernorm, prefix + "input_layernorm.weight")
            put(layer.post_attention_layernorm, prefix + "post_attention_layernorm.weight")
            for part in ("q_proj", "k_proj", "v_proj", "o_proj"):
                put(getattr(layer, part).weight, f"{prefix}self_attn.{part}.weight")
            for part in ("gate_proj", "up_proj", "down_proj"):
                put(getattr(layer, part).weight, f"{prefix}mlp.{part}.weight")

    def project(self, layer: LlamaLayer, x: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, heads, T, d], k and v [B, kv_heads, T, d] of ``x`` [B, T, H], RoPE applied
        with ``cos``/``sin`` broadcastable to [B, 1, T, d]."""
        c = self.config
        batch, length, _ = x.shape
        n = rms_norm(x, layer.input_layernorm, self.eps)
        q = layer.q_proj(n).view(batch, length, c.num_attention_heads, c.head_dim)
        k = layer.k_proj(n).view(batch, length, c.num_key_value_heads, c.head_dim)
        v = layer.v_proj(n).view(batch, length, c.num_key_value_heads, c.head_dim)
        return (apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin),
                v.transpose(1, 2))

    def attend(self, layer: LlamaLayer, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        """The layer's output for ``x`` [B, T, H] given its q and the keys/values it reads."""
        batch, length, _ = x.shape
        if length == 1 and not is_causal:  # one query a row: its heads as the query axis of
            c = self.config                # their KV head, so the cache is read, not copied
            grouped = q.reshape(batch, c.num_key_value_heads, self.groups, c.head_dim)
            o = F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask)
            o = o.reshape(batch, c.num_attention_heads, 1, c.head_dim)
        else:
            o = F.scaled_dot_product_attention(q, repeat_kv(k, self.groups),
                                               repeat_kv(v, self.groups), attn_mask=mask,
                                               is_causal=is_causal)
        x = x + layer.o_proj(o.transpose(1, 2).reshape(batch, length, -1))
        return layer.mlp(x, self.eps)

    def features(self, ids: torch.Tensor, streams: tuple[int, ...] = ()) -> Features:
        """One causal pass over ``ids`` [B, T] long at positions ``0..T-1`` (right padding
        changes nothing before it); ``streams``: the residual streams to keep (indices in
        ``[0, num_hidden_layers]``, see the module docstring)."""
        positions = torch.arange(ids.shape[1], device=ids.device)
        cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta)
        x = F.embedding(ids, self.embed)
        k = v = x  # bound by the first layer
        kept = {}
        for i, layer in enumerate(self.layers):
            if i in streams:
                kept[i] = x
            q, k, v = self.project(layer, x, cos, sin)
            x = self.attend(layer, x, q, k, v, None, is_causal=True)
        kept[len(self.layers)] = x
        return Features(rms_norm(x, self.norm, self.eps), k, v,
                        tuple(kept[i] for i in streams))

    def logits(self, hidden: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """[..., H] -> [..., rows] scores over the first ``rows`` ids (all by default)."""
        head = self.embed if rows is None else self.embed[:rows]
        return hidden @ head.t().to(hidden.dtype)
