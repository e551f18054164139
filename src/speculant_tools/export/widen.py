"""The trained pair widened to the shape of a real model, with zero padding that keeps its
function (``speculant scale-target PACKAGE OUT --shape realistic-1b``).

The cost-scaled targets of :mod:`~speculant_tools.export.cost_scale` keep the trained hidden
size and widen only the MLPs, so their passes have odd shapes (hidden 192, MLP 108,288) that
no real model has, and kernels tuned for real shapes never run. Here every dimension takes a
real model's value (``realistic-1b``: Llama 3.2 1B's hidden 2048, 16 layers, 32 query and
8 KV heads of 64, MLP 8192) and the trained function is embedded in it:

* **Hidden channels** ``[0, H)`` are the trained ones; the embedding's extra columns and every
  write into the residual stream's extra channels (``o_proj`` and ``down_proj`` rows) are
  zero, so the extra channels stay exactly 0 through the whole network.
* **RMSNorm** over ``H'`` channels of which ``H`` are non-zero: the mean square is
  ``H / H'`` of the trained one, so ``rms_norm_eps`` becomes ``eps · H / H'`` and each norm
  weight ``w · sqrt(H / H')``; the normalised real channels are then the trained ones.
* **Heads.** Trained KV head ``m`` is KV head ``m``; trained query head ``h`` (group
  ``h // G``) is query head ``(h // G) · G' + h % G``, so it reads the same KV head. Extra
  heads have random projections and zero ``o_proj`` columns: real work, no effect.
* **Head size** ``d → d' = r · d`` (``r`` an integer): trained dimension ``t`` of the first
  half sits at slot ``r · t`` (its partner ``d/2 + t`` at ``d'/2 + r · t``), where the RoPE
  frequency ``θ^(−2 r t / d')`` equals the trained ``θ^(−2 t / d)``; the queries are scaled
  by ``sqrt(r)`` so that ``q·k / sqrt(d')`` is the trained score. The query's other slots are
  zero (keys and values there are random: they meet only zero queries and zero ``o_proj``
  columns).
* **MLP units and layers** as in cost_scale: extra units with random ``gate``/``up`` rows and
  zero ``down_proj`` columns; extra layers before the trained last layer with zero ``o_proj``
  and ``down_proj``.
* **The chained drafter** is widened the same way (its fused input is
  ``[embedding (H') | carry (H')]``; ``in_proj`` takes the trained columns from both halves)
  and keeps its own MLP width, so it reads the target's last layer as it was trained to.

Everything that multiplies an exact zero is random (as real weights are); everything whose
product must vanish is zero. The logits equal the trained target's within rounding (the
scaled norm weights and queries are rounded to the package dtype once).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import numpy as np

from speculant_tools.export.config import (
    EMBEDDING,
    ExportError,
    LlamaConfig,
    drafter_shapes,
    target_shapes,
)

SHAPES = {  # named real shapes: LlamaConfig fields
    "realistic-1b": {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "intermediate_size": 8192, "head_dim": 64},
}


def layer_order(trained_layers: int, num_layers: int) -> list[int | None]:
    """Source of each layer of the scaled target: a trained layer's index, or None for an
    added layer. Added layers go just before the trained last layer, which stays last."""
    extra = num_layers - trained_layers
    return [*range(trained_layers - 1), *([None] * extra), trained_layers - 1]


def shape_fields(shape: str | Mapping[str, int]) -> dict[str, int]:
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ExportError(f"unknown shape {shape!r}", path="shape", value=shape,
                              expected=f"one of {', '.join(SHAPES)}")
        return dict(SHAPES[shape])
    return dict(shape)


def widened_config(config: LlamaConfig, shape: str | Mapping[str, int]) -> LlamaConfig:
    """The trained ``config`` at ``shape`` (a name of :data:`SHAPES` or its fields), with the
    epsilon that keeps the norms; every dimension must be at least the trained one, the
    groups too, and the head size a whole multiple of the trained one. Only the plain Llama
    graph widens (no variations, no RoPE scaling)."""
    if config.variant_fields:
        raise ExportError("widening places the plain Llama graph's weights; this target "
                          "declares more", path="config", value=config.variant_fields,
                          expected="no variations")
    fields = shape_fields(shape)
    wide = dataclasses.replace(config, **fields,
                               drafter_intermediate_size=config.drafter_intermediate_size,
                               rms_norm_eps=config.rms_norm_eps * config.hidden_size
                               / fields.get("hidden_size", config.hidden_size))
    checks = [(name, getattr(wide, name), getattr(config, name)) for name in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "intermediate_size", "head_dim")] + [("groups", wide.num_groups, config.num_groups)]
    for name, value, trained in checks:
        if value < trained:
            raise ExportError(f"the widened {name} ({value}) is below the trained {trained}",
                              path=f"shape.{name}", value=value, expected=f">= {trained}")
    if wide.head_dim % config.head_dim:
        raise ExportError("the widened head_dim must be a multiple of the trained one (RoPE "
                          "frequencies are kept by slot)", path="shape.head_dim",
                          value=wide.head_dim, expected=f"a multiple of {config.head_dim}")
    return wide


class _Layout:
    """Where trained indices go in the widened tensors."""

    def __init__(self, c: LlamaConfig, w: LlamaConfig) -> None:
        r, half = w.head_dim // c.head_dim, c.head_dim // 2
        slots = np.array([r * t for t in range(half)] + [w.head_dim // 2 + r * t
                                                         for t in range(half)])
        query_heads = [(h // c.num_groups) * w.num_groups + h % c.num_groups
                       for h in range(c.num_attention_heads)]
        self.hidden = np.arange(c.hidden_size)
        self.query = np.concatenate([head * w.head_dim + slots for head in query_heads])
        self.kv = np.concatenate([m * w.head_dim + slots for m in range(c.num_key_value_heads)])
        self.query_scale = math.sqrt(r)
        self.norm_scale = math.sqrt(c.hidden_size / w.hidden_size)
        self.real_query_heads = query_heads
        self.head_dim = w.head_dim


def widen_weights(config: LlamaConfig, target: Mapping[str, np.ndarray],
                  drafter: Mapping[str, np.ndarray], wide: LlamaConfig, seed: int = 0
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The target's and the drafter's weights at ``wide`` (from :func:`widened_config`), in
    the trained dtype, with the trained function (module docstring)."""

    rng = np.random.default_rng(seed)
    dtype = target[EMBEDDING].dtype
    at = _Layout(config, wide)
    n = config.num_hidden_layers
    spread = {kind: _spread([target[f"model.layers.{i}.{kind}"] for i in range(n)])
              for kind in {name.split(".", 3)[3] for name in target
                           if name.startswith("model.layers.")}}

    def random(kind: str) -> Callable[[tuple[int, ...]], np.ndarray]:
        mean, std = spread[kind]
        return lambda shape: (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
                              + np.float32(mean)).astype(dtype, copy=False)

    def zeros(shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape, dtype)

    def place(trained: np.ndarray, out: np.ndarray, rows, cols=None,
              scale: float = 1.0) -> np.ndarray:
        """``out`` with ``trained`` (times ``scale``) written at ``rows`` (and ``cols``)."""
        values = (trained.astype(np.float32) * np.float32(scale)).astype(dtype)
        if cols is None:
            out[rows] = values
        else:
            out[np.ix_(rows, cols)] = values
        return out

    def layer(source: Mapping[str, np.ndarray] | None, prefix: str,
              shapes: Mapping[str, tuple[int, ...]], units: int) -> dict[str, np.ndarray]:
        """One widened layer from ``source`` (weights keyed by kind; None: an added layer)."""
        out = {}
        for name, shape in shapes.items():
            if not name.startswith(prefix + "."):
                continue
            kind = name[len(prefix) + 1:]
            fill = random(kind)
            if source is None:
                zero = kind in ("self_attn.o_proj.weight", "mlp.down_proj.weight")
                out[name] = zeros(shape) if zero else fill(shape)
                continue
            trained = source[kind]
            unit_rows = np.arange(units)
            if kind.endswith("layernorm.weight"):
                out[name] = place(trained, zeros(shape), at.hidden, scale=at.norm_scale)
            elif kind == "self_attn.q_proj.weight":
                query = fill(shape)
                for head in at.real_query_heads:  # a real head's other slots: zero queries
                    query[head * at.head_dim:(head + 1) * at.head_dim] = 0
                out[name] = place(trained, query, at.query, at.hidden, at.query_scale)
            elif kind in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
                out[name] = place(trained, fill(shape), at.kv, at.hidden)
            elif kind == "self_attn.o_proj.weight":
                out[name] = place(trained, zeros(shape), at.hidden, at.query)
            elif kind in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
                out[name] = place(trained, fill(shape), unit_rows, at.hidden)
            elif kind == "mlp.down_proj.weight":
                out[name] = place(trained, zeros(shape), at.hidden, unit_rows)
            else:
                raise AssertionError(f"no rule for {name}")
        return out

    shapes = target_shapes(wide)
    wide_target = {EMBEDDING: place(target[EMBEDDING], zeros(shapes[EMBEDDING]),
                                    np.arange(config.vocab_size), at.hidden),
                   "model.norm.weight": place(target["model.norm.weight"],
                                              zeros((wide.hidden_size,)), at.hidden,
                                              scale=at.norm_scale)}
    for j, source in enumerate(layer_order(n, wide.num_hidden_layers)):
        trained = None if source is None else {
            name.split(".", 3)[3]: array for name, array in target.items()
            if name.startswith(f"model.layers.{source}.")}
        wide_target.update(layer(trained, f"model.layers.{j}", shapes,
                                 config.intermediate_size))

    h, h2 = config.hidden_size, wide.hidden_size
    draft_shapes = drafter_shapes(wide)
    in_cols = np.concatenate([at.hidden, h2 + at.hidden])  # [embedding | carry]
    wide_drafter = {
        "drafter.in_proj.weight": place(drafter["drafter.in_proj.weight"],
                                        zeros((h2, 2 * h2)), at.hidden, in_cols),
        "drafter.norm.weight": place(drafter["drafter.norm.weight"], zeros((h2,)), at.hidden,
                                     scale=at.norm_scale)}
    assert drafter["drafter.in_proj.weight"].shape == (h, 2 * h)
    trained_layer = {name[len("drafter.layer."):]: array for name, array in drafter.items()
                     if name.startswith("drafter.layer.")}
    wide_drafter.update(layer(trained_layer, "drafter.layer", draft_shapes,
                              config.drafter_intermediate_size))
    return ({name: wide_target[name] for name in shapes},
            {name: wide_drafter[name] for name in draft_shapes})


def _spread(arrays: list[np.ndarray]) -> tuple[float, float]:
    values = np.concatenate([a.astype(np.float32).ravel() for a in arrays])
    return float(values.mean()), float(values.std())
