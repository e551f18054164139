"""The model families the importers take, and what each declares: the one home of the
family -> :class:`~speculant_tools.export.LlamaConfig` variations mapping, for Hugging Face
folders (``config.json``'s ``model_type``) and GGUF files (``general.architecture``), and
back (``export-hf``'s ``config.json``). The graphs read the variations, never the family.

==========  ==========================================================================
family      variations (``LlamaConfig`` fields)
==========  ==========================================================================
Llama 1-3   none; ``rope_scaling`` linear or llama3 (3.1 and later), ``attention_bias``
            (q/k/v and o), an untied head where ``tie_word_embeddings`` is false
Mistral     every layer sliding within ``sliding_window`` (v0.1: 4096; later: none),
            an untied head
Qwen 2/2.5  q/k/v biases (no o bias); with ``use_sliding_window`` the layers from
            ``max_window_layers`` on slide (or as ``layer_types`` says)
Qwen 3      QK norms (RMSNorm over head_dim), Llama's ``attention_bias``, Qwen 2's window
Gemma 2     embeddings * sqrt(hidden), RMSNorm by (1 + w), GeGLU (gelu tanh), sandwich
            norms (``post_norms``), attention and final logit soft caps,
            ``query_pre_attn_scalar``, sliding layers 0, 2, 4, ... (window), tied head
Gemma 3     Gemma 2's, without the soft caps, with QK norms, 5 sliding layers to 1 global,
            sliding layers' RoPE at ``rope_local_base_freq``, global layers' scaled (4B-27B)
Phi-3       q/k/v and gate/up fused (split here), an untied head, partial rotary (Phi-4-mini),
            sliding where ``sliding_window`` is set (mini-4k: 2047), longrope (both sets)
==========  ==========================================================================

``dynamic`` RoPE scaling reads as plain RoPE with the context capped at the original one:
transformers' dynamic scaling leaves the frequencies unchanged up to there.

GGUF files written by llama.cpp's converter store a Gemma RMSNorm's ``1 + w`` (it adds the
one), so a Gemma GGUF imports with ``norm_weight_offset`` 0, and keeps its q/k rows in
Hugging Face's order (llama.cpp rotates Gemma, Phi-3 and Qwen in halves, as Hugging Face
does): only the ``llama`` architecture's rows (and q/k biases) are permuted. Mistral's
GGUFs say ``llama``. Biases and an untied ``output.weight`` are declared by the tensors a
GGUF holds, llama3 scaling by its ``rope_freqs.weight`` (the per-frequency divisors
llama.cpp's converter writes), as llama.cpp reads them. llama.cpp reads neither Gemma's
``query_pre_attn_scalar`` nor Gemma 3's local RoPE base from the file: it derives them as
here (the 27B models scale by ``hidden / heads``; the local base is 10000).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from speculant_tools.export.layer_types import FULL, LAYER_TYPES, SLIDING
from speculant_tools.export.rope import RopeScaling
from speculant_tools.importers.longrope import longrope_scaling

# export.config's LlamaConfig, read by attribute here and built by its callers from the
# fields returned here: export.config consults this table (LlamaConfig.from_hf, to_hf), so
# this module does not import it.
Config = Any

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
    expected: str = ""


@dataclass(frozen=True)
class Family:
    """One family: its name (messages, docs/models.md), its Hugging Face ``model_type`` and
    architecture, its GGUF architecture (None: its GGUFs say another family's), whether its
    checkpoints fuse q/k/v and gate/up (:data:`FUSED`), its variations from a
    ``config.json`` mapping or from a GGUF's keys, and ``config.json``'s fields of a
    configuration it expresses (None: not written back; a function's None: not this one)."""

    name: str
    model_type: str
    architecture: str
    gguf_arch: str | None
    hf_variations: Callable[[Mapping[str, Any], dict[str, Any]], dict[str, Any]]
    gguf_variations: Callable[[Any, str, dict[str, Any]], dict[str, Any]] | None = None
    is_fused: bool = False
    gguf_layer_names: dict[str, str] = field(default_factory=dict)  # GGUF -> HF, per layer
    gguf_permutes_qk: bool = False  # llama.cpp's converter interleaves q/k rows (llama)
    has_rope_scaling: bool = False  # linear and llama3 RoPE scaling are read
    hf_written: Callable[[Config], dict[str, Any] | None] | None = None


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
                      f"architecture (expected {expected!r})", remedy, repr(expected))


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
    return {**_hf_gemma(data, sizes, pattern=2), "rope_scaling": _rope_scaling(data, sizes, ())}


def _hf_gemma3(data: Mapping[str, Any], sizes: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's RoPE: ``rope_parameters`` per layer type (transformers 5), or the older
    ``rope_theta`` (global, default 1e6), ``rope_local_base_freq`` (default 1e4) and
    ``rope_scaling`` (global layers only: linear, factor 8 in the 4B, 12B and 27B)."""
    rope = data.get("rope_parameters") or {}
    full, local = rope.get(FULL) or {}, rope.get(SLIDING) or {}
    if _rope_type(local) != "default":
        raise Refusal(f"rope_parameters.{SLIDING}.rope_type", _rope_type(local),
                      "Gemma 3's sliding layers rotate with plain RoPE", expected="default")
    scaled = {"rope_scaling": data.get("rope_scaling")} if _rope_type(full) == "default" \
        else {"rope_parameters": full}  # the global layers' scaling
    variations = _hf_gemma(data, sizes, pattern=6)
    variations.update(qk_norm=True, rope_scaling=_rope_scaling(scaled, sizes, ("linear",)),
                      rope_local_base_freq=float(
        local.get("rope_theta") or data.get("rope_local_base_freq") or 10000.0))
    sizes["rope_theta"] = float(full.get("rope_theta") or data.get("rope_theta") or 1e6)
    return variations


def _hf_phi3(data: Mapping[str, Any], sizes: dict[str, Any]) -> dict[str, Any]:
    _check(data, "hidden_act", "silu", "silu")
    _check(data, "attention_bias", False, False)
    key, rope = _rope_parameters(data)
    rotary = _rotary_dim(data, rope, sizes)
    scaling = _longrope(key, rope, data, sizes, rotary or sizes["head_dim"]) \
        if _rope_type(rope) in ("longrope", "su") else _rope_scaling(data, sizes, ())
    return {"tie_word_embeddings": bool(data.get("tie_word_embeddings", False)),
            "sliding_window": data.get("sliding_window"), "rope_scaling": scaling,
            "rotary_dim": rotary}


def _rotary_dim(data: Mapping[str, Any], rope: Mapping[str, Any], sizes: dict[str, Any]
                ) -> int | None:
    """Partial rotary's turned values, ``int(head_dim * factor)`` (None: all), as transformers."""
    factor = rope.get("partial_rotary_factor", data.get("partial_rotary_factor", 1.0))
    if not isinstance(factor, int | float) or not 0 < factor <= 1:
        raise Refusal("partial_rotary_factor", factor, "not a fraction", expected="(0, 1]")
    rotary = int(sizes["head_dim"] * factor)
    return None if rotary == sizes["head_dim"] else rotary


def _longrope(key: str, rope: dict[str, Any], data: Mapping[str, Any],
              sizes: dict[str, Any], rotated: int) -> RopeScaling:
    """Phi-3's longrope (``su``) as transformers computes it: the short factors, the long
    ones beyond ``original_max_position_embeddings`` (:func:`longrope_scaling`), the
    attention factor ``sqrt(1 + log(s) / log(original))`` (s = max / original; 1 where
    s <= 1) unless the config gives one."""
    original = rope.get("original_max_position_embeddings",
                        data.get("original_max_position_embeddings"))
    if not isinstance(original, int) or original < 2:
        raise Refusal("original_max_position_embeddings", original, "longrope needs the "
                      "original context", "complete config.json from the model card", "int")
    short, long = rope.get("short_factor"), rope.get("long_factor")
    for name, value in (("short_factor", short), ("long_factor", short if long is None else long)):
        if not isinstance(value, list) or len(value) != rotated // 2:
            raise Refusal(f"{key}.{name}", value, "longrope needs one factor per rotated "
                          "pair", expected=f"{rotated // 2} numbers")
    scale = sizes["max_position_embeddings"] / original
    attention = rope.get("attention_factor") or (
        math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
    return longrope_scaling(tuple(short), None if long is None else tuple(long), original,
                            float(attention), sizes)


# -- Llama, Mistral, Qwen 2/2.5, Qwen 3 ------------------------------------------------------
ROPE_REMEDY = ("delete the scaling from config.json (rope_scaling, or rope_parameters' keys "
               "other than rope_theta) to run the model at its original context")


def _hf_llama_like(data: Mapping[str, Any], sizes: dict[str, Any], *, tied: bool,
                   qkv_bias: bool | None = None, output_bias: bool | None = None,
                   qk_norm: bool = False, window: str = "none") -> dict[str, Any]:
    """Llama's variations: ``tied`` where config.json omits ``tie_word_embeddings``; the
    biases fixed by the family, or (None) both ``attention_bias``; ``window`` ``none``,
    ``every_layer`` (Mistral) or ``upper_layers`` (Qwen, :func:`_qwen_window`)."""
    _check(data, "mlp_bias", False, False)
    _check(data, "hidden_act", "silu", "silu")
    rotary = _rotary_dim(data, _rope_parameters(data)[1], sizes)
    bias = bool(data.get("attention_bias", False))
    variations = {"tie_word_embeddings": bool(data.get("tie_word_embeddings", tied)),
                  "attention_bias": bias if qkv_bias is None else qkv_bias,
                  "attention_output_bias": bias if output_bias is None else output_bias,
                  "qk_norm": qk_norm, "rope_scaling": _rope_scaling(data, sizes),
                  "rotary_dim": rotary}
    if window == "every_layer":  # MistralConfig's default window where config.json has none
        variations["sliding_window"] = data.get("sliding_window", 4096)
    elif window == "upper_layers":
        variations.update(_qwen_window(data, sizes["num_hidden_layers"]))
    return variations


def _rope_parameters(data: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """transformers 5's ``rope_parameters`` where it is, else 4's ``rope_scaling``: the key
    and its mapping (empty for none)."""
    key = "rope_parameters" if isinstance(data.get("rope_parameters"), Mapping) \
        else "rope_scaling"
    rope = data.get(key)
    return key, dict(rope) if isinstance(rope, Mapping) else {}


def _rope_scaling(data: Mapping[str, Any], sizes: dict[str, Any],
                  kinds: tuple[str, ...] = ("linear", "llama3")) -> RopeScaling | None:
    """``kinds`` (linear, llama3) as :class:`RopeScaling`; ``dynamic`` as plain RoPE, the
    context (``sizes``) capped at the original one; any other type refused."""
    key, rope = _rope_parameters(data)
    kind = _rope_type(rope)
    original = rope.get("original_max_position_embeddings",
                        data.get("original_max_position_embeddings"))
    if kind == "default":
        return None
    if kind == "dynamic":
        sizes["max_position_embeddings"] = min(sizes["max_position_embeddings"],
                                               original or sizes["max_position_embeddings"])
        return None
    if kind not in kinds:
        raise Refusal(f"{key}.rope_type", kind, f"RoPE scaling {kind!r} is not exported",
                      ROPE_REMEDY, " or ".join(("default", "dynamic", *kinds)))
    needed = ("factor",) if kind == "linear" else ("factor", "low_freq_factor",
                                                   "high_freq_factor")
    values = {name: rope.get(name) for name in needed}
    if kind == "llama3":
        values["original_max_position_embeddings"] = original
    missing = [name for name, value in values.items() if value is None]
    if missing:
        raise Refusal(key, rope, f"{kind} RoPE scaling lacks {', '.join(missing)}",
                      "complete it from the model card", ", ".join(values))
    return RopeScaling(kind, **values)


def _qwen_window(data: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """Qwen's sliding layers, as transformers reads them: none without
    ``use_sliding_window``; else ``layer_types`` where config.json has them, or the layers
    from ``max_window_layers`` (default 28) on."""
    window = data.get("sliding_window") if data.get("use_sliding_window", False) else None
    types = data.get("layer_types")
    if isinstance(types, list) and not set(types) <= set(LAYER_TYPES):
        raise Refusal("layer_types", sorted(set(types) - set(LAYER_TYPES)),
                      "attention layer types other than full and sliding are not exported",
                      expected=" or ".join(LAYER_TYPES))
    if window is None:
        return {}
    if isinstance(types, list):
        sliding = tuple(kind == SLIDING for kind in types)
    else:
        sliding = tuple(i >= data.get("max_window_layers", 28) for i in range(num_layers))
    if not any(sliding):
        return {}
    return {"sliding_window": window, "layer_types": None if all(sliding) else tuple(
        SLIDING if is_sliding else FULL for is_sliding in sliding)}


def _written_llama(c: Config) -> dict[str, Any] | None:
    if c.qk_norm or c.attention_bias != c.attention_output_bias or any(c.sliding_layers):
        return None
    return {"attention_bias": c.attention_bias}


def _written_mistral(c: Config) -> dict[str, Any] | None:
    if c.qk_norm or c.attention_bias or c.attention_output_bias or not all(c.sliding_layers):
        return None
    return {"sliding_window": c.sliding_window}


def _written_qwen(c: Config, *, qk_norm: bool) -> dict[str, Any] | None:
    """Qwen 2 (q/k/v biases) or Qwen 3 (QK norms, Llama's biases); sliding layers are the
    layers from ``max_window_layers`` on, as transformers builds them."""
    sliding = c.sliding_layers
    first = sliding.index(True) if any(sliding) else len(sliding)
    biases = (c.attention_bias == c.attention_output_bias) if qk_norm else (
        c.attention_bias and not c.attention_output_bias)
    if c.qk_norm != qk_norm or not biases or not all(sliding[first:]):
        return None
    return {"attention_bias": c.attention_bias, "use_sliding_window": any(sliding),
            "sliding_window": c.sliding_window, "max_window_layers": first,
            "layer_types": [SLIDING if is_sliding else FULL for is_sliding in sliding]}


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


def _gguf_llama(fields: Any, arch: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """A window where the file has one (a Mistral converted with it)."""
    return {"sliding_window": fields.count(f"{arch}.attention.sliding_window", None)}


def _hf_qwen3(data: Mapping[str, Any], sizes: dict[str, Any]) -> dict[str, Any]:
    sizes["head_dim"] = data.get("head_dim") or 128  # Qwen3Config's default
    return _hf_llama_like(data, sizes, tied=False, qk_norm=True, window="upper_layers")


QK_NORM_GGUF_NAMES = {"attn_q_norm.weight": "self_attn.q_norm.weight",
                      "attn_k_norm.weight": "self_attn.k_norm.weight"}
GEMMA_GGUF_NAMES = {"post_attention_norm.weight": "post_attention_layernorm.weight",
                    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
                    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
                    **QK_NORM_GGUF_NAMES}
FAMILIES = (  # export-hf writes a configuration as the first family that expresses it
    # speculant's own config.json files omit tie_word_embeddings and tie
    Family("Llama", "llama", "LlamaForCausalLM", "llama",
           partial(_hf_llama_like, tied=True), _gguf_llama, gguf_permutes_qk=True,
           has_rope_scaling=True, hf_written=_written_llama),
    Family("Mistral", "mistral", "MistralForCausalLM", None,
           partial(_hf_llama_like, tied=False, qkv_bias=False, output_bias=False,
                   window="every_layer"), has_rope_scaling=True, hf_written=_written_mistral),
    Family("Qwen 2", "qwen2", "Qwen2ForCausalLM", "qwen2",
           partial(_hf_llama_like, tied=False, qkv_bias=True, output_bias=False,
                   window="upper_layers"), lambda fields, arch, sizes: {},
           has_rope_scaling=True, hf_written=partial(_written_qwen, qk_norm=False)),
    Family("Qwen 3", "qwen3", "Qwen3ForCausalLM", "qwen3", _hf_qwen3,
           lambda fields, arch, sizes: {"qk_norm": True}, gguf_layer_names=QK_NORM_GGUF_NAMES,
           has_rope_scaling=True, hf_written=partial(_written_qwen, qk_norm=True)),
    Family("Gemma 2", "gemma2", "Gemma2ForCausalLM", "gemma2", _hf_gemma2, _gguf_gemma2,
           gguf_layer_names=GEMMA_GGUF_NAMES),
    Family("Gemma 3", "gemma3_text", "Gemma3ForCausalLM", "gemma3", _hf_gemma3, _gguf_gemma3,
           gguf_layer_names=GEMMA_GGUF_NAMES, has_rope_scaling=True),  # global layers' only
    Family("Phi-3", "phi3", "Phi3ForCausalLM", "phi3", _hf_phi3, _gguf_phi3, is_fused=True,
           gguf_layer_names={"attn_qkv.weight": "self_attn.qkv_proj.weight",
                             "ffn_up.weight": "mlp.gate_up_proj.weight"}),
)
BY_MODEL_TYPE = {family.model_type: family for family in FAMILIES}
BY_ARCHITECTURE = {family.architecture: family for family in FAMILIES}
BY_GGUF_ARCH = {family.gguf_arch: family for family in FAMILIES if family.gguf_arch}
# the variations a family export-hf writes has (Gemma's others: none of them)
WRITTEN = ("tie_word_embeddings", "qk_norm", "sliding_window", "layer_types",
           "attention_bias", "attention_output_bias", "rope_scaling")


def hf_family(data: Mapping[str, Any]) -> Family | None:
    """The family of a ``config.json`` mapping: its ``model_type``'s, else its
    ``architectures[0]``'s; neither named: Llama (speculant's older configs); None: a
    family not listed here."""
    if data.get("model_type") in BY_MODEL_TYPE:
        return BY_MODEL_TYPE[data["model_type"]]
    architectures = data.get("architectures")
    name = architectures[0] if isinstance(architectures, list) and architectures else None
    if isinstance(name, str) and name in BY_ARCHITECTURE:
        return BY_ARCHITECTURE[name]
    return BY_MODEL_TYPE["llama"] if name is None and data.get("model_type") is None else None


def fields_from_hf(data: Mapping[str, Any]) -> dict[str, Any]:
    """LlamaConfig's fields of a ``config.json`` mapping of any family here (a
    :class:`Refusal` names an unknown family or a field outside the exported
    architecture; a missing size raises KeyError)."""
    family = hf_family(data)
    if family is None:
        raise Refusal("model_type", data.get("model_type"), "this architecture is not "
                      "supported", "docs/models.md lists the families that import",
                      " or ".join(BY_MODEL_TYPE))
    return hf_config(family, data)


def config_to_hf(config: Config) -> dict[str, Any]:
    """``config.json``'s ``architectures``, ``model_type`` and family fields for
    ``config``: the first family whose variations express it (a :class:`Refusal` names a
    variation none of them has)."""
    remedy = "keep the checkpoint the package was imported from"
    for name, value in config.variant_fields.items():
        if name not in WRITTEN:
            raise Refusal(name, value, "export-hf writes Llama, Mistral and Qwen "
                          "configurations; this variation is none of theirs", remedy)
    scaling = config.rope_scaling
    if scaling is not None and scaling.rope_type in ("factors", "longrope"):
        raise Refusal("rope_scaling", scaling.rope_type, "per-frequency RoPE factors (a "
                      "GGUF's, longrope's one set) have no config.json form", remedy)
    rope = None if scaling is None else {"rope_type": scaling.rope_type, **{
        key: value for key, value in vars(scaling).items()
        if key != "rope_type" and value is not None}}
    for family in FAMILIES:
        written = family.hf_written(config) if family.hf_written else None
        if written is not None:
            return {"architectures": [family.architecture], "model_type": family.model_type,
                    "rope_scaling": rope, **written}
    changed = config.variant_fields
    raise Refusal(next(iter(changed)), changed, "no family export-hf writes has these "
                  "variations together", remedy)


def hf_config(family: Family, data: Mapping[str, Any]) -> dict[str, Any]:
    """LlamaConfig's fields of a ``config.json`` of ``family`` (a :class:`Refusal` names a
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
    return {**sizes, **variations}


def fused_shapes(config: Config, shapes: dict[str, tuple[int, ...]]
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


def split_fused(config: Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
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
