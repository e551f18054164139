"""The chained drafter in PyTorch: the function ``speculant_tools.export.drafter_graph``
writes, under the names ``speculant_tools.export.drafter_shapes`` lists.

One step, for a chain context at position ``c`` (the last position the target consumed;
every step of a proposal uses position id ``c`` and reads the target's last-layer keys and
values of positions ``0..c``)::

    fused  = concat(E[token] * scale, carry)                  # [.., 2H]
    x      = in_proj(fused)                                   # Linear(2H -> H), no bias
    x      = x + o_proj(attention(rope_c(q_proj(input_layernorm(x))), K_last[0..c], V_last[0..c]))
    x      = x + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = post_attention_layernorm(x)
    carry' = norm(x)                                          # the next step's carry
    scores = carry' @ E[:N]^T                                 # the target's table, first N rows

``E`` is the target's (tied) embedding table, ``scale`` is ``sqrt(H)`` and ``carry_0`` is the
``folded_carry_seed`` at ``c``: with ``features="last"`` the target's hidden state after its
final norm; with ``features="eagle3"`` (:class:`SeedFusion`, EAGLE-3's fused features)

    carry_0 = norm_s(fc(concat(n_0(s_low), n_1(s_mid), n_2(s_high))))   # Linear(3H -> H)

over the target's residual streams at ``c`` (:func:`eagle3_layers`), a projection trained
with the drafter and exported into the TARGET's graph (``fused_hidden_states``). The drafter
owns no keys, values or table: only the weights below.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from speculant_tools.export import LlamaConfig, drafter_shapes
from speculant_tools.export.config import SEED_FUSION
from speculant_tools.train_drafter.llama import (
    Features,
    TorchLlama,
    apply_rope,
    repeat_kv,
    rms_norm,
)


def eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """The residual streams EAGLE-3's seed fuses, for a target of ``num_layers`` layers: low
    and middle as EAGLE-3 takes them (entering layer 2 and layer ``L // 2``; fewer layers:
    ``L // 2`` for both), and high the last layer's output (``L``) where EAGLE-3 takes the
    stream entering layer ``L - 3``: EAGLE-3 trains its head from scratch, while this drafter
    starts as the target's last layer on the final hidden state, which the high slot then
    reproduces exactly (:meth:`SeedFusion.init_from_target`). SmolLM2-135M: (2, 15, 30)."""
    return (min(2, num_layers // 2), num_layers // 2, num_layers)


def seed_layers(features: str, num_layers: int) -> tuple[int, ...] | None:
    """``seed_feature_layers`` for ``--features``: None for ``last``."""
    return eagle3_layers(num_layers) if features == "eagle3" else None


class SeedFusion(nn.Module):
    """EAGLE-3's fused seed: ``norm(fc(concat(stream_norms[j](s_j))))`` over the target's
    residual streams ``layers`` (each ``[.., H]``), the function the exported target's
    ``fused_hidden_states`` output computes (``_Graph.seed_output``)."""

    def __init__(self, config: LlamaConfig, layers: tuple[int, ...]) -> None:
        super().__init__()
        h = config.hidden_size
        self.layers, self.eps = tuple(layers), config.rms_norm_eps
        self.stream_norms = nn.ParameterList(nn.Parameter(torch.ones(h)) for _ in layers)
        self.fc = nn.Linear(len(layers) * h, h, bias=False)
        self.norm = nn.Parameter(torch.ones(h))

    def forward(self, streams: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """``streams`` [.., H] each, in ``layers`` order -> the seed [.., H]."""
        normed = [rms_norm(s, w, self.eps) for s, w in zip(streams, self.stream_norms,
                                                            strict=True)]
        fused = self.fc(torch.cat(normed, dim=-1).to(self.fc.weight.dtype))
        return rms_norm(fused, self.norm, self.eps)

    @torch.no_grad()
    def init_from_target(self, target: TorchLlama) -> None:
        """``fc`` = the identity on the highest stream, 0 on the others; the outer norm the
        target's final norm: with the last layer's output as the highest stream the seed is
        the target's hidden state after its final norm (up to the norm's ``eps``, applied
        twice), so training starts from the ``last`` drafter's seed."""
        h = self.norm.shape[0]
        high = max(range(len(self.layers)), key=self.layers.__getitem__)
        weight = torch.zeros(h, len(self.layers) * h)
        weight[:, high * h:(high + 1) * h] = torch.eye(h)
        self.fc.weight.copy_(weight.to(self.fc.weight.device))
        for norm in self.stream_norms:
            norm.fill_(1.0)
        self.norm.copy_(target.norm)

    def named(self) -> dict[str, torch.Tensor]:
        named = {f"{SEED_FUSION}stream_norms.{j}.weight": w
                 for j, w in enumerate(self.stream_norms)}
        return {**named, f"{SEED_FUSION}fc.weight": self.fc.weight,
                f"{SEED_FUSION}norm.weight": self.norm}


class ChainedDrafter(nn.Module):
    """The drafter's weights, named as ``drafter_shapes`` names them minus ``drafter.``;
    ``seed_feature_layers`` (None: the ``last`` seed) adds the :class:`SeedFusion`."""

    def __init__(self, config: LlamaConfig, intermediate_size: int,
                 seed_feature_layers: tuple[int, ...] | None = None) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        q = config.num_attention_heads * d
        self.config = config
        self.fusion = SeedFusion(config, seed_feature_layers) if seed_feature_layers else None
        self.scale = math.sqrt(h)
        self.in_proj = nn.Linear(2 * h, h, bias=False)
        self.input_layernorm = nn.Parameter(torch.ones(h))
        self.q_proj, self.o_proj = nn.Linear(h, q, bias=False), nn.Linear(q, h, bias=False)
        self.post_attention_layernorm = nn.Parameter(torch.ones(h))
        self.gate_proj = nn.Linear(h, intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, h, bias=False)
        self.norm = nn.Parameter(torch.ones(h))

    @property
    def intermediate_size(self) -> int:
        return self.up_proj.weight.shape[0]

    @property
    def seed_feature_layers(self) -> tuple[int, ...] | None:
        return self.fusion.layers if self.fusion is not None else None

    @property
    def stream_layers(self) -> tuple[int, ...]:
        """The residual streams :meth:`seed` needs from ``TorchLlama.features``."""
        return self.fusion.layers if self.fusion is not None else ()

    def seed(self, state: Features) -> torch.Tensor:
        """The carry seed [B, T, H] at every position: the target's final hidden state, or
        the fused streams (``state`` from ``features(ids, streams=self.stream_layers)``)."""
        return state.hidden if self.fusion is None else self.fusion(state.streams)

    @torch.no_grad()
    def init_from_target(self, target: TorchLlama, generator: torch.Generator,
                         noise: float = 1e-3) -> None:
        """Start from the target's last layer (its query, output and MLP weights where the
        widths agree) and final norm, with ``in_proj = [noise | I]``: at the start a step
        passes its carry through the target's last layer."""
        last = target.layers[-1]
        self.input_layernorm.copy_(last.input_layernorm)
        self.post_attention_layernorm.copy_(last.post_attention_layernorm)
        self.q_proj.weight.copy_(last.q_proj.weight)
        self.o_proj.weight.copy_(last.o_proj.weight)
        if self.intermediate_size == last.up_proj.weight.shape[0]:
            for part in ("gate_proj", "up_proj", "down_proj"):
                getattr(self, part).weight.copy_(getattr(last, part).weight)
        self.norm.copy_(target.norm)
        h = self.config.hidden_size
        weight = torch.zeros(h, 2 * h)
        weight[:, :h] = torch.randn(h, h, generator=generator) * noise
        weight[:, h:] = torch.eye(h)
        self.in_proj.weight.copy_(weight.to(self.in_proj.weight.device))
        if self.fusion is not None:
            self.fusion.init_from_target(target)

    def step(self, embed: torch.Tensor, tokens: torch.Tensor, carry: torch.Tensor,
             cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
             ) -> torch.Tensor:
        """One drafter invocation for the chain contexts at positions ``0..R-1`` of each row.

        tokens [B, R] long; carry [B, R, H]; cos, sin [R, d] at each context's position;
        keys, values [B, kv_heads, R, d]: the target's last layer. Context ``r`` reads keys
        ``0..r`` (a causal mask), as the runtime's step at position ``r`` reads the borrowed
        cache cut to ``r + 1``. Returns the next carry [B, R, H]."""
        c = self.config
        batch, length = tokens.shape
        e = F.embedding(tokens, embed) * self.scale
        x = self.in_proj(torch.cat([e.to(carry.dtype), carry], dim=-1))
        n = rms_norm(x, self.input_layernorm, c.rms_norm_eps)
        q = self.q_proj(n).view(batch, length, c.num_attention_heads, c.head_dim)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        o = F.scaled_dot_product_attention(q, repeat_kv(keys, c.num_groups).to(q.dtype),
                                           repeat_kv(values, c.num_groups).to(q.dtype),
                                           is_causal=True)
        x = x + self.o_proj(o.transpose(1, 2).reshape(batch, length, -1))
        n = rms_norm(x, self.post_attention_layernorm, c.rms_norm_eps)
        x = x + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n))
        return rms_norm(x, self.norm, c.rms_norm_eps)

    # -- the export names ------------------------------------------------------------------
    def export_config(self) -> LlamaConfig:
        """The target's config with this drafter's MLP width and seed (what
        ``drafter_shapes`` reads)."""
        from dataclasses import replace

        return replace(self.config, drafter_intermediate_size=self.intermediate_size,
                       seed_feature_layers=self.seed_feature_layers)

    def _named(self) -> dict[str, torch.Tensor]:
        return {
            "drafter.in_proj.weight": self.in_proj.weight,
            "drafter.layer.input_layernorm.weight": self.input_layernorm,
            "drafter.layer.self_attn.q_proj.weight": self.q_proj.weight,
            "drafter.layer.self_attn.o_proj.weight": self.o_proj.weight,
            "drafter.layer.post_attention_layernorm.weight": self.post_attention_layernorm,
            "drafter.layer.mlp.gate_proj.weight": self.gate_proj.weight,
            "drafter.layer.mlp.up_proj.weight": self.up_proj.weight,
            "drafter.layer.mlp.down_proj.weight": self.down_proj.weight,
            "drafter.norm.weight": self.norm,
            **(self.fusion.named() if self.fusion is not None else {}),
        }

    def export_arrays(self, dtype: type = np.float32) -> dict[str, np.ndarray]:
        """The weights under ``drafter_shapes`` names, in its order, as ``dtype`` arrays."""
        named = self._named()
        return {name: named[name].detach().to("cpu", torch.float32).numpy().astype(dtype)
                for name in drafter_shapes(self.export_config())}

    @torch.no_grad()
    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """The inverse of :meth:`export_arrays` (any float dtype)."""
        for name, parameter in self._named().items():
            parameter.copy_(torch.from_numpy(np.asarray(arrays[name], np.float32)))
