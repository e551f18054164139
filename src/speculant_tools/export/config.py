"""The Llama pair's configuration and its weight names (Hugging Face names, exactly).

Target (``LlamaForCausalLM``, tied embeddings), per layer ``i``::

    model.embed_tokens.weight                       [vocab, hidden]
    model.layers.{i}.input_layernorm.weight         [hidden]
    model.layers.{i}.self_attn.q_proj.weight        [heads * head_dim, hidden]
    model.layers.{i}.self_attn.k_proj.weight        [kv_heads * head_dim, hidden]
    model.layers.{i}.self_attn.v_proj.weight        [kv_heads * head_dim, hidden]
    model.layers.{i}.self_attn.o_proj.weight        [hidden, heads * head_dim]
    model.layers.{i}.post_attention_layernorm.weight [hidden]
    model.layers.{i}.mlp.gate_proj.weight           [intermediate, hidden]
    model.layers.{i}.mlp.up_proj.weight             [intermediate, hidden]
    model.layers.{i}.mlp.down_proj.weight           [hidden, intermediate]
    model.norm.weight                               [hidden]

and where the configuration's variations ask for them::

    lm_head.weight                                  [vocab, hidden]   (untied)
    model.layers.{i}.self_attn.{q,k}_norm.weight    [head_dim]        (qk_norm)
    model.layers.{i}.pre_feedforward_layernorm.weight  [hidden]       (post_norms; then
    model.layers.{i}.post_feedforward_layernorm.weight [hidden]        post_attention_layernorm
                                                    normalizes the attention's output)
    model.layers.{i}.self_attn.{q,k,v}_proj.bias    [rows of the weight] (attention_bias)
    model.layers.{i}.self_attn.o_proj.bias          [hidden]          (attention_output_bias)

Chained drafter (one layer without k/v projections; the LM head is the target's table, or
its first ``draft_vocab_size`` rows; a plain Llama layer whatever the target's variations,
rotating with the target's RoPE, ``rope_scaling`` included)::

    drafter.in_proj.weight                          [hidden, 2 * hidden]
    drafter.layer.input_layernorm.weight            [hidden]
    drafter.layer.self_attn.q_proj.weight           [heads * head_dim, hidden]
    drafter.layer.self_attn.o_proj.weight           [hidden, heads * head_dim]
    drafter.layer.post_attention_layernorm.weight   [hidden]
    drafter.layer.mlp.{gate,up,down}_proj.weight    as the target's, with
                                                    drafter_intermediate_size
    drafter.norm.weight                             [hidden]

With ``seed_feature_layers`` (EAGLE-3's fused features, ``n`` streams; docs/design/chained.md)
the drafter also owns the projection that makes its carry seed, which the package writer puts
into the TARGET's graph (its ``fused_hidden_states`` output)::

    drafter.seed_fusion.stream_norms.{j}.weight     [hidden]          (j < n)
    drafter.seed_fusion.fc.weight                   [hidden, n * hidden]
    drafter.seed_fusion.norm.weight                 [hidden]

``drafter_intermediate_size`` defaults to ``intermediate_size``; it differs only where the
target's MLPs were widened after training (``speculant_tools.export.cost_scale``) and the drafter
kept its own width. ``draft_vocab_size`` defaults to ``vocab_size`` (the drafter scores every
id: ``vocabulary: identical``); a smaller N makes its LM head ``model.embed_tokens.weight[:N]``
and its logits N wide, each draft id used unchanged as a target id (``vocabulary: subset``,
``proposer_vocab_size: N``): BPE ids in merge order put the frequent tokens first.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from speculant_tools.export.errors import ExportError
from speculant_tools.export.layer_types import FULL, LAYER_TYPES, SLIDING
from speculant_tools.export.rope import RopeScaling

__all__ = ["FULL", "LAYER_TYPES", "SLIDING", "ExportError", "LlamaConfig", "RopeScaling"]

EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"  # tied: accepted in a state dict only when equal to EMBEDDING
DTYPES = {"float32": np.float32, "float16": np.float16}
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # SiLU; GELU's tanh approximation (GeGLU)


@dataclass(frozen=True)
class LlamaConfig:
    """The sizes of a ``LlamaForCausalLM`` with tied embeddings, no biases, SiLU, plain RoPE,
    and the declared variations of that architecture the target graphs follow (the fields
    after ``draft_vocab_size``; Llama 3.x, Mistral, Qwen 2/2.5/3, Gemma 2/3 and Phi-3 are
    Llama with some of them set). The chained drafter is its own architecture and ignores
    them, all but ``rope_scaling``."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int  # the package's context cap and the RoPE table length
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    drafter_intermediate_size: int | None = None  # None: intermediate_size
    draft_vocab_size: int | None = None  # None: vocab_size (the drafter's LM head rows)
    # None: the carry seed is the final norm's output (hidden_states); (l, m, h): the residual
    # streams entering those layers (num_hidden_layers: the last layer's output) fused
    seed_feature_layers: tuple[int, ...] | None = None
    # -- architecture variations of the target (importers/families.py maps each family to
    # them; the defaults are Llama's, and to_json leaves a default out) --
    tie_word_embeddings: bool = True  # False: the LM head is its own lm_head.weight
    embedding_multiplier: float = 1.0  # embeddings * this (Gemma: sqrt(hidden_size))
    norm_weight_offset: float = 0.0  # every target RMSNorm scales by (offset + weight)
    hidden_act: str = "silu"  # the MLP's gate activation: ACTIVATIONS
    post_norms: bool = False  # Gemma's sandwich: see target_shapes
    qk_norm: bool = False  # an RMSNorm over head_dim on queries and keys, before RoPE
    attn_logit_softcapping: float | None = None  # scores -> cap * tanh(scores / cap)
    final_logit_softcapping: float | None = None  # logits -> cap * tanh(logits / cap)
    query_pre_attn_scalar: float | None = None  # scores scaled by its ** -0.5 (None: head_dim)
    sliding_window: int | None = None  # a sliding layer's query q sees keys > q - window
    layer_types: tuple[str, ...] | None = None  # LAYER_TYPES per layer (None: see below)
    rope_local_base_freq: float | None = None  # RoPE theta of sliding layers (None: rope_theta)
    attention_bias: bool = False  # q/k/v projections carry biases (Qwen 2, Llama's flag)
    attention_output_bias: bool = False  # o_proj carries one too (Llama's flag: both)
    # RoPE's frequencies rescaled (Llama 3.x, linear), and the values it turns: each head's
    # first rotary_dim (halves of them, as transformers' partial rotary: Phi-4-mini 96 of
    # 128; None: all). Unlike the fields above, the chained drafter rotates with them too (it
    # reads the target's rotated keys)
    rope_scaling: RopeScaling | None = None
    rotary_dim: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rope_scaling, Mapping):  # from JSON
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.drafter_intermediate_size is None:
            object.__setattr__(self, "drafter_intermediate_size", self.intermediate_size)
        if self.draft_vocab_size is None:
            object.__setattr__(self, "draft_vocab_size", self.vocab_size)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "bool" and not isinstance(value, bool):
                raise ExportError(f"config.{field.name} must be true or false",
                                  path=f"config.{field.name}", value=value)
            if field.type in ("int", "int | None") and value is not None and (
                    not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ExportError(f"config.{field.name} must be a positive integer",
                                  path=f"config.{field.name}", value=value)
        self._check_seed_feature_layers()
        if self.draft_vocab_size > self.vocab_size:
            raise ExportError("config.draft_vocab_size exceeds the target's vocabulary",
                              path="config.draft_vocab_size", value=self.draft_vocab_size,
                              expected=f"1 <= draft_vocab_size <= {self.vocab_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ExportError("num_attention_heads must be a multiple of num_key_value_heads",
                              path="config.num_key_value_heads",
                              value=(self.num_attention_heads, self.num_key_value_heads))
        if self.head_dim % 2:
            raise ExportError("head_dim must be even (RoPE rotates halves)",
                              path="config.head_dim", value=self.head_dim)
        if self.rotary_dim is not None and (self.rotary_dim % 2
                                            or self.rotary_dim > self.head_dim):
            raise ExportError("rotary_dim must be even and at most head_dim",
                              path="config.rotary_dim", value=self.rotary_dim,
                              expected=f"an even number <= {self.head_dim}")
        if not (self.rms_norm_eps > 0 and self.rope_theta > 0):
            raise ExportError("rms_norm_eps and rope_theta must be positive",
                              value=(self.rms_norm_eps, self.rope_theta))
        self._check_variations()

    def _check_seed_feature_layers(self) -> None:
        layers = self.seed_feature_layers
        if layers is None:
            return
        if isinstance(layers, list):  # from JSON
            layers = tuple(layers)
            object.__setattr__(self, "seed_feature_layers", layers)
        if not (isinstance(layers, tuple) and layers and all(
                isinstance(i, int) and not isinstance(i, bool)
                and 0 <= i <= self.num_hidden_layers for i in layers)):
            raise ExportError("config.seed_feature_layers must be layer indices",
                              path="config.seed_feature_layers", value=layers,
                              expected=f"a non-empty list of integers in [0, "
                                       f"{self.num_hidden_layers}] (the residual stream "
                                       f"entering that layer; {self.num_hidden_layers}: the "
                                       "last layer's output)")

    def _check_variations(self) -> None:
        """The architecture variations' values: known names, finite positive numbers, one
        layer type per layer (a list from JSON becomes a tuple)."""
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
            if len(self.layer_types) != self.num_hidden_layers or not set(
                    self.layer_types) <= set(LAYER_TYPES):
                raise ExportError("config.layer_types must name one of LAYER_TYPES per layer",
                                  path="config.layer_types", value=self.layer_types,
                                  expected=f"{self.num_hidden_layers} of {LAYER_TYPES}")
            if SLIDING in self.layer_types and self.sliding_window is None:
                raise ExportError("sliding layers need config.sliding_window",
                                  path="config.sliding_window", value=None)
        if self.hidden_act not in ACTIVATIONS:
            raise ExportError("config.hidden_act is outside the exported architecture",
                              path="config.hidden_act", value=self.hidden_act,
                              expected=" or ".join(ACTIVATIONS))
        for name in ("embedding_multiplier", "attn_logit_softcapping",
                     "final_logit_softcapping", "query_pre_attn_scalar", "rope_local_base_freq"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float)
                                          and math.isfinite(value) and value > 0):
                raise ExportError(f"config.{name} must be a positive finite number",
                                  path=f"config.{name}", value=value)
        if not (isinstance(self.norm_weight_offset, int | float)
                and math.isfinite(self.norm_weight_offset)):
            raise ExportError("config.norm_weight_offset must be a finite number",
                              path="config.norm_weight_offset", value=self.norm_weight_offset)
        scaling = self.rope_scaling
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise ExportError("config.rope_scaling must be a RopeScaling or None",
                              path="config.rope_scaling", value=scaling)
        if scaling is not None and scaling.rope_type in ("factors", "longrope") and len(
                scaling.frequency_factors) != self.rotated_dim // 2:
            raise ExportError("one RoPE frequency factor per rotated pair",
                              path="config.rope_scaling.frequency_factors",
                              value=len(scaling.frequency_factors),
                              expected=f"{self.rotated_dim // 2} (head_dim / 2, or "
                                       "rotary_dim / 2)")

    @property
    def variant_fields(self) -> dict[str, Any]:
        """The fields where this target differs from the plain Llama graph (its
        :data:`VARIATIONS`, ``rope_scaling`` and ``rotary_dim``): what a tool that computes
        only that graph (widening, train-drafter, speculators heads) refuses by name."""
        changed = {name: getattr(self, name) for name, default in VARIATIONS.items()
                   if getattr(self, name) != default}
        for name in ("rope_scaling", "rotary_dim"):
            if getattr(self, name) is not None:
                changed[name] = getattr(self, name)
        return changed

    @property
    def rotated_dim(self) -> int:
        """How many values of each head RoPE turns (``rotary_dim``, default all)."""
        return self.rotary_dim or self.head_dim

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        """Per layer, whether it attends within ``sliding_window`` (``layer_types`` None:
        every layer where a window is set, as Mistral and Phi-3, else none)."""
        if self.layer_types is None:
            return (self.sliding_window is not None,) * self.num_hidden_layers
        return tuple(kind == SLIDING for kind in self.layer_types)

    @property
    def attention_scale(self) -> float:
        """The factor of q . k: ``query_pre_attn_scalar ** -0.5`` (default ``head_dim``)."""
        return float(self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def has_subset_vocabulary(self) -> bool:
        """Whether the drafter scores only the first ``draft_vocab_size`` ids."""
        return self.draft_vocab_size < self.vocab_size

    @property
    def num_groups(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    # -- Hugging Face --------------------------------------------------------------------
    @classmethod
    def from_hf(cls, config: Any) -> LlamaConfig:
        """From a ``LlamaConfig`` here, a ``transformers`` config object or a ``config.json``
        mapping of a family :mod:`speculant_tools.importers.families` lists (its
        ``model_type``; none: Llama). A field outside the exported architecture raises
        :class:`ExportError` naming the key and what to do."""
        from speculant_tools.importers.families import Refusal, fields_from_hf

        if isinstance(config, LlamaConfig):
            return config
        data = config.to_dict() if hasattr(config, "to_dict") else config
        if not isinstance(data, Mapping):
            raise ExportError("config must be a mapping or a transformers config",
                              value=type(config).__name__)
        try:
            return cls(**fields_from_hf(data))
        except KeyError as missing:
            raise ExportError(f"config has no {missing.args[0]!r}", path="config",
                              expected="a config.json of a family docs/models.md lists"
                              ) from None
        except Refusal as refusal:
            raise ExportError(refusal.message, path=f"config.{refusal.path}",
                              value=refusal.value, expected=refusal.expected,
                              remedy=refusal.remedy) from None

    def to_hf(self, dtype: str = "float32", eos_token_id: int | None = None) -> dict[str, Any]:
        """``config.json`` of the transformers model that computes this graph: the first
        family of :mod:`speculant_tools.importers.families` whose fields express it (Llama,
        Mistral, Qwen 2, Qwen 3); a variation none of them has raises :class:`ExportError`
        naming it."""
        from speculant_tools.importers.families import Refusal, config_to_hf

        try:
            family_fields = config_to_hf(self)
        except Refusal as refusal:
            raise ExportError(refusal.message, path=f"config.{refusal.path}",
                              value=refusal.value, remedy=refusal.remedy) from None
        return {
            "architectures": family_fields.pop("architectures"),
            "model_type": family_fields.pop("model_type"),
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "hidden_act": "silu", "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
            "mlp_bias": False, "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": dtype, "eos_token_id": eos_token_id, "use_cache": True,
            **family_fields,
        }

    # -- storage in the graphs -----------------------------------------------------------
    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        for name, default in VARIATIONS.items():  # Llama's packages stay as they were
            if data[name] == default:
                del data[name]
        for name in ("rope_scaling", "rotary_dim"):
            if data[name] is None:
                del data[name]  # likewise
        if data.get("rope_scaling", {}).get("long_factors", 0) is None:
            del data["rope_scaling"]["long_factors"]  # likewise
        if data["drafter_intermediate_size"] == self.intermediate_size:
            del data["drafter_intermediate_size"]  # the default: packages stay as they were
        if data["draft_vocab_size"] == self.vocab_size:
            del data["draft_vocab_size"]  # likewise
        if data["seed_feature_layers"] is None:
            del data["seed_feature_layers"]  # likewise
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LlamaConfig:
        return cls(**json.loads(text))


VARIATIONS = {name: LlamaConfig.__dataclass_fields__[name].default for name in (
    "tie_word_embeddings", "embedding_multiplier", "norm_weight_offset", "hidden_act",
    "post_norms", "qk_norm", "attn_logit_softcapping", "final_logit_softcapping",
    "query_pre_attn_scalar", "sliding_window", "layer_types", "rope_local_base_freq",
    "attention_bias", "attention_output_bias")}


# -- weight names -------------------------------------------------------------------------
def _layer_shapes(c: LlamaConfig, prefix: str, with_kv: bool,
                  intermediate: int | None = None) -> dict[str, tuple[int, ...]]:
    h, q, kv, f = c.hidden_size, c.num_attention_heads * c.head_dim, \
        c.num_key_value_heads * c.head_dim, intermediate or c.intermediate_size
    shapes = {f"{prefix}.input_layernorm.weight": (h,),
              f"{prefix}.self_attn.q_proj.weight": (q, h)}
    if with_kv:
        shapes[f"{prefix}.self_attn.k_proj.weight"] = (kv, h)
        shapes[f"{prefix}.self_attn.v_proj.weight"] = (kv, h)
    shapes.update({f"{prefix}.self_attn.o_proj.weight": (h, q),
                   f"{prefix}.post_attention_layernorm.weight": (h,),
                   f"{prefix}.mlp.gate_proj.weight": (f, h),
                   f"{prefix}.mlp.up_proj.weight": (f, h),
                   f"{prefix}.mlp.down_proj.weight": (h, f)})
    return shapes


def target_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every target weight, in graph order."""
    shapes = {EMBEDDING: (config.vocab_size, config.hidden_size)}
    for i in range(config.num_hidden_layers):
        shapes.update(_layer_shapes(config, f"model.layers.{i}", with_kv=True))
        shapes.update(_variation_shapes(config, f"model.layers.{i}"))
    shapes["model.norm.weight"] = (config.hidden_size,)
    if not config.tie_word_embeddings:
        shapes[LM_HEAD] = (config.vocab_size, config.hidden_size)
    return shapes


def _variation_shapes(c: LlamaConfig, prefix: str) -> dict[str, tuple[int, ...]]:
    """A target layer's weights beyond Llama's: biases, QK norms, Gemma's sandwich norms."""
    shapes = {}
    if c.attention_bias:
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        for part, rows in (("q", q), ("k", kv), ("v", kv)):
            shapes[f"{prefix}.self_attn.{part}_proj.bias"] = (rows,)
    if c.attention_output_bias:
        shapes[f"{prefix}.self_attn.o_proj.bias"] = (c.hidden_size,)
    if c.qk_norm:
        shapes[f"{prefix}.self_attn.q_norm.weight"] = (c.head_dim,)
        shapes[f"{prefix}.self_attn.k_norm.weight"] = (c.head_dim,)
    if c.post_norms:
        for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
            shapes[f"{prefix}.{name}.weight"] = (c.hidden_size,)
    return shapes


def pre_mlp_norm(config: LlamaConfig, prefix: str) -> str:
    """The norm before a target layer's MLP: Llama's ``post_attention_layernorm``; with
    ``post_norms`` (Gemma) ``pre_feedforward_layernorm``, where ``post_attention_layernorm``
    normalizes the attention's output and ``post_feedforward_layernorm`` the MLP's."""
    name = "pre_feedforward_layernorm" if config.post_norms else "post_attention_layernorm"
    return f"{prefix}.{name}.weight"


def drafter_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every drafter weight (without the tied LM head)."""
    h = config.hidden_size
    shapes = {"drafter.in_proj.weight": (h, 2 * h)}
    shapes.update(_layer_shapes(config, "drafter.layer", with_kv=False,
                                intermediate=config.drafter_intermediate_size))
    shapes["drafter.norm.weight"] = (h,)
    shapes.update(seed_fusion_shapes(config))
    return shapes


SEED_FUSION = "drafter.seed_fusion."  # the drafter weights that live in the target's graph


def seed_fusion_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the seed projection's weights (none without
    ``seed_feature_layers``): ``norm(fc(concat(stream_norms[j](s_j))))``."""
    layers, h = config.seed_feature_layers, config.hidden_size
    if layers is None:
        return {}
    shapes = {f"{SEED_FUSION}stream_norms.{j}.weight": (h,) for j in range(len(layers))}
    shapes[f"{SEED_FUSION}fc.weight"] = (h, len(layers) * h)
    shapes[f"{SEED_FUSION}norm.weight"] = (h,)
    return shapes


def checked_weights(weights: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
                    dtype: str, what: str) -> dict[str, np.ndarray]:
    """``weights`` as arrays of ``dtype`` in the order of ``shapes``; a missing, unexpected
    or misshapen name raises :class:`ExportError` (all of them listed). A tied
    ``lm_head.weight`` equal to the embedding is dropped."""
    arrays = {name: np.asarray(value) for name, value in weights.items()}
    if LM_HEAD in arrays and EMBEDDING in arrays and LM_HEAD not in shapes:
        if not np.array_equal(arrays[LM_HEAD], arrays[EMBEDDING]):
            raise ExportError(f"{what}: {LM_HEAD} differs from {EMBEDDING}; the exported "
                              "architecture ties them", path=LM_HEAD)
        del arrays[LM_HEAD]
    missing = [name for name in shapes if name not in arrays]
    unexpected = sorted(name for name in arrays if name not in shapes)
    misshapen = [f"{name} {tuple(arrays[name].shape)} (expected {shapes[name]})"
                 for name in shapes if name in arrays and arrays[name].shape != shapes[name]]
    problems = [f"missing {', '.join(missing)}"] if missing else []
    problems += [f"unexpected {', '.join(unexpected)}"] if unexpected else []
    problems += [f"shape of {', '.join(misshapen)}"] if misshapen else []
    if problems:
        raise ExportError(f"{what} do not match the configuration: " + "; ".join(problems))
    with np.errstate(over="ignore"):  # overflow is reported below, by name
        cast = {name: np.ascontiguousarray(arrays[name], dtype=DTYPES[check_dtype(dtype)])
                for name in shapes}
    non_finite = [name for name, array in cast.items() if not np.isfinite(array).all()]
    if non_finite:
        raise ExportError(f"{what}: non-finite values in {dtype}: {', '.join(non_finite)}",
                          expected="finite values (float16 holds |x| <= 65504)")
    return cast


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {tuple(DTYPES)}", path="dtype", value=dtype)
    return dtype
