"""The model families the importers take beyond Llama, and what each declares: the one home
of the family -> :class:`~speculant_tools.export.LlamaConfig` variations mapping, for
Hugging Face folders (``config.json``'s ``model_type``) and GGUF files
(``general.architecture``). The graphs read the variations, never the family.

=========  ===========================================================================
family     variations (``LlamaConfig`` fields)
=========  ===========================================================================
Gemma 2    embeddings * sqrt(hidden), RMSNorm by (1 + w), GeGLU (gelu tanh), sandwich
           norms (``post_norms``), attention and final logit soft caps,
           ``query_pre_attn_scalar``, sliding layers 0, 2, 4, ... (window), tied head
Gemma 3    Gemma 2's, without the soft caps, with QK norms, 5 sliding layers to 1 global,
           sliding layers' RoPE at ``rope_local_base_freq``
Phi-3      q/k/v and gate/up fused in the checkpoint (split here), an untied head,
           every layer sliding where ``sliding_window`` is set (Phi-3-mini-4k: 2047)
=========  ===========================================================================

GGUF files written by llama.cpp's converter store a Gemma RMSNorm's ``1 + w`` (it adds the
one), so a Gemma GGUF imports with ``norm_weight_offset`` 0, and keeps its q/k rows in
Hugging Face's order (llama.cpp rotates Gemma and Phi-3 in halves, as Hugging Face does):
only the ``llama`` architecture's rows are permuted. llama.cpp reads neither Gemma's
``query_pre_attn_scalar`` nor Gemma 3's local RoPE base from the file: it derives them as
here (the 27B models scale by ``hidden / heads``; the local base is 10000).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speculant_tools.export.config import FULL, SLIDING, LlamaConfig

FUSED = {  # a fused Hugging Face weight -> its parts, stacked on the output axis in order
    "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                  "self_attn.v_proj.weight"),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}


@dataclass
class Refusal(Exception):
    """A family's field outside what the exporter builds (the importer adds the file)."""

    path: str
    value: Any
    message: str
    remedy: str = ""


@dataclass(frozen=True)
class Family:
    """One family: its name (messages, docs/models.md), its Hugging Face ``model_type`` and
    GGUF architecture, whether its checkpoints fuse q/k/v and gate/up (:data:`FUSED`), and
    its variations from a ``config.json`` mapping or from a GGUF's keys."""

    name: str
    model_type: str
    gguf_arch: str
    hf_variations: Callable[[Mapping[str, Any], dict[str, Any]], dict[str, Any]]
    gguf_variations: Callable[[Any, str, dict[str, Any]], dict[str, Any]]
    is_fused: bool = False
    gguf_layer_names: dict[str, str] = field(default_factory=dict)  # GGUF -> HF, per layer


def _gemma_common(num_layers: int, hidden: int, sliding_window: int | None,
                  pattern: int) -> dict[str, Any]:
    """What Gemma 2 and 3 share; layer ``i`` slides unless ``(i + 1) % pattern == 0``."""
    return {"embedding_multiplier": math.sqrt(hidden), "hidden_act": "gelu_pytorch_tanh",
            "post_norms": True, "sliding_window": sliding_window,
            "layer_types": tuple(SLIDING if (i + 1) % pattern else FULL
                                 for i in range(num_layers))}


def _check(data: Mapping[str, Any], key: str, expected: Any, default: Any,
           remedy: str = "") -> None:
    value = data.get(key, default)
    if value != expected and not (value is None and expected is False):
        raise Refusal(key, value, f"config.{key} = {value!r} is outside the exported "
                      f"architecture (expected {expected!r})", remedy)


def _rope_type(rope: Any) -> str:
    rope = rope if isinstance(rope, Mapping) else {}
    return rope.get("rope_type", rope.get("type", "default"))


def _hf_gemma(data: Mapping[str, Any], sizes: dict[str, Any], *, pattern: int
              ) -> dict[str, Any]:
    _check(data, "attention_bias", False, False)
    _check(data, "use_bidirectional_attention", False, None)
    act = data.get("hidden_activation") or data.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise Refusal("hidden_activation", act, "only GELU's tanh approximation is exported")
    variations = _gemma_common(sizes["num_hidden_layers"], sizes["hidden_size"],
                               data.get("sliding_window"),
                               data.get("sliding_window_pattern") or pattern)
    if data.get("layer_types") is not None:
        variations["layer_types"] = tuple(data["layer_types"])
    variations.update(norm_weight_offset=1.0,
                      query_pre_attn_scalar=data.get("query_pre_attn_scalar")
                      or sizes["head_dim"],
                      attn_logit_softcapping=data.get("attn_logit_softcapping"),
                      final_logit_softcapping=data.get("final_logit_softcapping"))
    return variations


def _hf_gemma2(data: Mapping[str, Any], sizes: dict[str, Any]) -> dict[str, Any]:
    _refuse_rope_scaling(data, ("rope_scaling", "rope_parameters"))
    return _hf_gemma(data, sizes, pattern=2)


def _hf_gemma3(data: Mapping[str, Any], sizes: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's RoPE: ``rope_parameters`` per layer type (transformers 5), or the older
    ``rope_theta`` (global, default 1e6), ``rope_local_base_freq`` (default 1e4) and
    ``rope_scaling`` (global layers only)."""
    rope = data.get("rope_parameters") or {}
    full, local = rope.get(FULL) or {}, rope.get(SLIDING) or {}
    for path, params in (("rope_scaling", data.get("rope_scaling")),
                         (f"rope_parameters.{FULL}", full), (f"rope_parameters.{SLIDING}", local)):
        if _rope_type(params) != "default":
            raise Refusal(f"{path}.rope_type", _rope_type(params),
                          "Gemma 3's rope scaling (the 4B, 12B and 27B models: linear, factor "
                          "8) is not exported yet", "Gemma 3 1B (no rope scaling) imports")
    variations = _hf_gemma(data, sizes, pattern=6)
    variations.update(qk_norm=True, rope_local_base_freq=float(
        local.get("rope_theta") or data.get("rope_local_base_freq") or 10000.0))
    sizes["rope_theta"] = float(full.get("rope_theta") or data.get("rope_theta") or 1e6)
    return variations


def _hf_phi3(data: Mapping[str, Any], sizes: dict[str, Any]) -> dict[str, Any]:
    _refuse_rope_scaling(data, ("rope_scaling", "rope_parameters"),
                         remedy="Phi-3-mini-4k (no rope scaling) imports; the 128k models' "
                                "longrope (su) scaling is not exported yet")
    _check(data, "hidden_act", "silu", "silu")
    _check(data, "attention_bias", False, False)
    factor = (data.get("rope_parameters") or {}).get("partial_rotary_factor",
                                                     data.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise Refusal("partial_rotary_factor", factor, "partial rotary (Phi-3.5/Phi-4 mini) "
                      "is not exported", "Phi-3-mini-4k imports")
    return {"tie_word_embeddings": bool(data.get("tie_word_embeddings", False)),
            "sliding_window": data.get("sliding_window")}


def _refuse_rope_scaling(data: Mapping[str, Any], keys: tuple[str, ...], remedy: str = ""
                         ) -> None:
    for key in keys:
        if _rope_type(data.get(key)) != "default":
            raise Refusal(f"{key}.rope_type", _rope_type(data.get(key)),
                          "rope scaling is not exported for this family", remedy)


# -- GGUF ----------------------------------------------------------------------------------
def _gguf_gemma(fields: Any, arch: str, sizes: dict[str, Any], *, pattern: int,
                large_layers: int) -> dict[str, Any]:
    """llama.cpp's Gemma: sliding window from the file, the pattern and the attention
    scale from the model (``large_layers`` layers: the 27B, scaled by hidden / heads)."""
    variations = _gemma_common(sizes["num_hidden_layers"], sizes["hidden_size"],
                               fields.count(f"{arch}.attention.sliding_window"), pattern)
    scalar = (sizes["hidden_size"] // sizes["num_attention_heads"]
              if sizes["num_hidden_layers"] == large_layers else sizes["head_dim"])
    variations["query_pre_attn_scalar"] = scalar
    return variations


def _gguf_gemma2(fields: Any, arch: str, sizes: dict[str, Any]) -> dict[str, Any]:
    variations = _gguf_gemma(fields, arch, sizes, pattern=2, large_layers=46)
    variations.update(
        attn_logit_softcapping=fields.positive(f"{arch}.attn_logit_softcapping", None),
        final_logit_softcapping=fields.positive(f"{arch}.final_logit_softcapping", None))
    return variations


def _gguf_gemma3(fields: Any, arch: str, sizes: dict[str, Any]) -> dict[str, Any]:
    variations = _gguf_gemma(fields, arch, sizes, pattern=6, large_layers=62)
    variations.update(qk_norm=True, rope_local_base_freq=10000.0)
    return variations


def _gguf_phi3(fields: Any, arch: str, sizes: dict[str, Any]) -> dict[str, Any]:
    return {"tie_word_embeddings": False,
            "sliding_window": fields.count(f"{arch}.attention.sliding_window", None)}


GEMMA_GGUF_NAMES = {"post_attention_norm.weight": "post_attention_layernorm.weight",
                    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
                    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
                    "attn_q_norm.weight": "self_attn.q_norm.weight",
                    "attn_k_norm.weight": "self_attn.k_norm.weight"}
FAMILIES = (
    Family("Gemma 2", "gemma2", "gemma2", _hf_gemma2, _gguf_gemma2,
           gguf_layer_names=GEMMA_GGUF_NAMES),
    Family("Gemma 3", "gemma3_text", "gemma3", _hf_gemma3, _gguf_gemma3,
           gguf_layer_names=GEMMA_GGUF_NAMES),
    Family("Phi-3", "phi3", "phi3", _hf_phi3, _gguf_phi3, is_fused=True,
           gguf_layer_names={"attn_qkv.weight": "self_attn.qkv_proj.weight",
                             "ffn_up.weight": "mlp.gate_up_proj.weight"}),
)
BY_MODEL_TYPE = {family.model_type: family for family in FAMILIES}
BY_GGUF_ARCH = {family.gguf_arch: family for family in FAMILIES}


def hf_config(family: Family, data: Mapping[str, Any]) -> LlamaConfig:
    """The configuration of a ``config.json`` of ``family`` (a :class:`Refusal` names a
    field outside the exported architecture; a missing size raises KeyError)."""
    rope = data.get("rope_parameters") or {}
    sizes: dict[str, Any] = {
        "vocab_size": data["vocab_size"], "hidden_size": data["hidden_size"],
        "num_hidden_layers": data["num_hidden_layers"],
        "num_attention_heads": data["num_attention_heads"],
        "num_key_value_heads": data.get("num_key_value_heads") or data["num_attention_heads"],
        "intermediate_size": data["intermediate_size"],
        "max_position_embeddings": data["max_position_embeddings"],
        "head_dim": data.get("head_dim") or data["hidden_size"] // data["num_attention_heads"],
        "rms_norm_eps": float(data.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(data.get("rope_theta") or rope.get("rope_theta") or 10000.0)}
    variations = family.hf_variations(data, sizes)
    return LlamaConfig(**sizes, **variations)


def fused_shapes(config: LlamaConfig, shapes: dict[str, tuple[int, ...]]
                 ) -> dict[str, tuple[int, ...]]:
    """``shapes`` (HF name -> shape) with each layer's :data:`FUSED` parts as their one
    fused weight, as a fused family's checkpoint holds them."""
    out = dict(shapes)
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}"
        for fused, parts in FUSED.items():
            rows = sum(out.pop(f"{prefix}.{part}")[0] for part in parts)
            out[f"{prefix}.{fused}"] = (rows, config.hidden_size)
    return out


def split_fused(config: LlamaConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``weights`` with each fused weight split into its parts (rows in order: q, k, v and
    gate, up; the parts' widths from ``config``). A weight of the wrong height is left as it
    is, for the shape check to name."""
    q, kv = config.num_attention_heads * config.head_dim, \
        config.num_key_value_heads * config.head_dim
    widths = {"self_attn.qkv_proj.weight": (q, kv, kv),
              "mlp.gate_up_proj.weight": (config.intermediate_size,) * 2}
    out = {}
    for name, array in weights.items():
        suffix = next((s for s in FUSED if name.endswith(f".{s}")), None)
        if suffix is None or array.shape[0] != sum(widths[suffix]):
            out[name] = array
            continue
        prefix = name.removesuffix(suffix)
        bounds = np.cumsum(widths[suffix])[:-1]
        for part, rows in zip(FUSED[suffix], np.split(array, bounds, axis=0), strict=True):
            out[prefix + part] = np.ascontiguousarray(rows)
    return out
