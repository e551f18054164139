"""Tiny random-weight Llama, Mistral and Qwen models (Gemma's and Phi-3's are
tests/importers/family_models.py's), written in code: a Hugging
Face folder (config.json as transformers writes it, model.safetensors, tokenizer.json,
tokenizer_config.json) and a GGUF (gguf's GGUFWriter, laid out as llama.cpp's converter lays
it out: q/k rows interleaved for ``llama``, llama3 scaling as ``rope_freqs.weight``).

Each :class:`Case` holds the ``config.json`` and the LlamaConfig its import must declare;
``drive`` runs an imported package's decoder graph pass by pass with ONNX Runtime (appended
or static caches), for the logits of a prefill and the decode steps after it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import onnxruntime as ort
from gguf import GGMLQuantizationType as Q

from export.export_models import EOS_ID, write_tokenizer
from importers import gguf_models
from importers.gguf_models import MERGES, SPECIALS, llama_cpp_permute
from speculant_tools.export import LlamaConfig, RopeScaling, target_shapes
from speculant_tools.export.config import FULL, SLIDING

VOCAB = 50
SIZES = {"vocab_size": VOCAB, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64,
         "rms_norm_eps": 1e-5}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


@dataclass(frozen=True)
class Case:
    """One family's tiny model: its ``config.json`` and the config its import declares."""

    name: str
    hf: dict[str, Any]
    config: LlamaConfig
    gguf_arch: str | None = None  # None: no GGUF of this case
    gguf_keys: dict[str, Any] = field(default_factory=dict)  # extra GGUF metadata

    @property
    def gguf_config(self) -> LlamaConfig:
        """What the GGUF import declares: llama3 scaling comes as per-frequency factors."""
        scaling = self.config.rope_scaling
        if scaling is None or scaling.rope_type != "llama3":
            return self.config
        return replace(self.config, rope_scaling=RopeScaling(
            "factors", frequency_factors=tuple(llama3_rope_factors(self.config))))


def _case(name: str, architecture: str, model_type: str, hidden: int, intermediate: int,
          declared: dict[str, Any], hf: dict[str, Any], gguf_arch: str | None = None,
          gguf_keys: dict[str, Any] | None = None) -> Case:
    sizes = {**SIZES, "hidden_size": hidden, "intermediate_size": intermediate}
    config = LlamaConfig(**sizes, **declared)
    data = {"architectures": [architecture], "model_type": model_type, **sizes,
            "hidden_act": "silu", "eos_token_id": EOS_ID, "bos_token_id": EOS_ID,
            "tie_word_embeddings": config.tie_word_embeddings, "rope_theta": config.rope_theta,
            "torch_dtype": "float32", **hf}
    return Case(name, data, config, gguf_arch, gguf_keys or {})


CASES = (
    # Llama 3.1/3.2: llama3 RoPE scaling, untied head (8B)
    _case("llama3", "LlamaForCausalLM", "llama", 64, 96,
          {"rope_scaling": RopeScaling(**LLAMA3), "tie_word_embeddings": False},
          {"rope_scaling": LLAMA3, "attention_bias": False}, gguf_arch="llama"),
    # Llama 2 style linear RoPE scaling, with attention_bias (q, k, v and o biases)
    _case("llama-linear-bias", "LlamaForCausalLM", "llama", 64, 96,
          {"rope_scaling": RopeScaling("linear", factor=2.0), "attention_bias": True,
           "attention_output_bias": True},
          {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "attention_bias": True},
          gguf_arch="llama", gguf_keys={"llama.rope.scaling.type": "linear",
                                        "llama.rope.scaling.factor": 2.0}),
    # Mistral 7B v0.1: a sliding window (3 here) on every layer, untied head
    _case("mistral", "MistralForCausalLM", "mistral", 64, 96,
          {"sliding_window": 3, "tie_word_embeddings": False}, {"sliding_window": 3},
          gguf_arch="llama", gguf_keys={"llama.attention.sliding_window": 3}),
    # Qwen 2.5: q/k/v biases (no o bias), tied (0.5B-3B), rope_theta 1e6
    _case("qwen2", "Qwen2ForCausalLM", "qwen2", 64, 96,
          {"attention_bias": True, "rope_theta": 1e6},
          {"use_sliding_window": False, "sliding_window": None, "max_window_layers": 2},
          gguf_arch="qwen2"),
    # Qwen 2 with use_sliding_window: layers from max_window_layers (1) on slide
    _case("qwen2-sliding", "Qwen2ForCausalLM", "qwen2", 64, 96,
          {"attention_bias": True, "sliding_window": 3, "layer_types": (FULL, SLIDING)},
          {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1}),
    # Qwen 3: per-head q/k RMSNorm, head_dim 16 with hidden 32 / 4 heads (q is 64 wide)
    _case("qwen3", "Qwen3ForCausalLM", "qwen3", 32, 64, {"qk_norm": True},
          {"attention_bias": False, "use_sliding_window": False, "sliding_window": None},
          gguf_arch="qwen3"),
)
GGUF_CASES = tuple(case for case in CASES if case.gguf_arch)


def random_weights(config: LlamaConfig, seed: int = 11) -> dict[str, np.ndarray]:
    """Norm weights near 1 (the final norm with random signs), biases ~ N(0, 0.25), linear
    weights and the untied head ~ N(0, 4 / in), the table ~ N(0, 4)."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in target_shapes(config).items():
        if name.endswith(".bias"):
            weights[name] = 0.5 * rng.standard_normal(shape)
        elif len(shape) == 1:
            weights[name] = 1.0 + 0.1 * rng.standard_normal(shape)
            if name == "model.norm.weight":
                weights[name] *= rng.choice([-1.0, 1.0], shape)
        elif name == "model.embed_tokens.weight":
            weights[name] = 2.0 * rng.standard_normal(shape)
        else:
            weights[name] = 2.0 * rng.standard_normal(shape) / np.sqrt(shape[1])
    return {name: array.astype(np.float32) for name, array in weights.items()}


def write_hf_folder(folder: Path, case: Case, weights: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(case.hf, indent=2))
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "</s>", "bos_token": None, "chat_template":
         "{% for m in messages %}{{ m['content'] }}{% endfor %}"}))
    return folder


# -- GGUF, as llama.cpp's convert_hf_to_gguf.py writes one ----------------------------------
GGUF_NAMES = {"input_layernorm.weight": "attn_norm.weight",
              "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight":
              "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
              "self_attn.o_proj.weight": "attn_output.weight",
              "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
              "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
              "self_attn.q_norm.weight": "attn_q_norm.weight",
              "self_attn.k_norm.weight": "attn_k_norm.weight",
              "post_attention_layernorm.weight": "ffn_norm.weight",
              "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
              "mlp.down_proj.weight": "ffn_down.weight"}
GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
TOKENS = [t for t in gguf_models.TOKENS if not t.startswith("<unused")]
TOKENS += [f"<unused{i}>" for i in range(VOCAB - len(TOKENS))]


def llama3_rope_factors(config: LlamaConfig) -> list[float]:
    """``LlamaModel.generate_extra_tensors`` of convert_hf_to_gguf.py: the divisor of each
    frequency (``rope_freqs.weight``), from the llama3 scaling's parameters."""
    scaling = config.rope_scaling
    base, dim = config.rope_theta, config.head_dim
    factor, low_freq_factor = scaling.factor, scaling.low_freq_factor
    high_freq_factor = scaling.high_freq_factor
    old_context_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    rope_factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (
                high_freq_factor - low_freq_factor)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return [float(np.float32(x)) for x in rope_factors]


def _gguf_name(name: str) -> str:
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    _, _, layer, rest = name.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[rest]}"


def write_gguf(path: Path, case: Case, weights: dict[str, np.ndarray],
               linear_type: Q = Q.F32) -> Path:
    """The case's GGUF: its weights in F32, the linear layers' in ``linear_type`` (quantized
    by gguf), metadata keys of its architecture, q/k rows (and biases) permuted for
    ``llama`` only."""
    c, arch = case.config, case.gguf_arch
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_vocab_size(c.vocab_size)
    for key, value in case.gguf_keys.items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in TOKENS])
    writer.add_token_merges(MERGES)
    writer.add_eos_token_id(2)
    if c.rope_scaling is not None and c.rope_scaling.rope_type == "llama3":
        writer.add_tensor("rope_freqs.weight",
                          np.asarray(llama3_rope_factors(c), np.float32), raw_dtype=Q.F32)
    for name, array in weights.items():
        if arch == "llama" and ".q_proj." in name:
            array = llama_cpp_permute(array, c.num_attention_heads, c.num_attention_heads)
        elif arch == "llama" and ".k_proj." in name:
            array = llama_cpp_permute(array, c.num_attention_heads, c.num_key_value_heads)
        array = np.ascontiguousarray(array, np.float32)
        if linear_type != Q.F32 and name.endswith("proj.weight"):
            writer.add_tensor(_gguf_name(name), gguf.quants.quantize(array, linear_type),
                              raw_dtype=linear_type)
            continue
        writer.add_tensor(_gguf_name(name), array, raw_dtype=Q.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# -- running a package's decoder graph ------------------------------------------------------
def drive(root: Path, blocks: list[list[int]], capacity: int = 16) -> np.ndarray:
    """Logits ``[sum of block lengths, vocab]`` float64 of the package's decoder run over
    ``blocks`` one pass each (the first a prefill), caches carried from pass to pass:
    appended (past + block -> present) or static (buffers of ``capacity`` slots and
    ``cache_lengths``), as the graph's inputs say."""
    session = ort.InferenceSession(str(root / "decoder" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    is_static = "cache_lengths" in inputs
    dtype = np.float16 if inputs["past_key_values.0.key"].type == "tensor(float16)" \
        else np.float32
    cache_names = [name for name in inputs if name.startswith("past_key_values.")]
    _, kv_heads, _, head_dim = inputs[cache_names[0]].shape
    length = capacity if is_static else 0
    caches = {name: np.zeros((1, kv_heads, length, head_dim), dtype) for name in cache_names}
    done, rows = 0, []
    for block in blocks:
        feeds = {"input_ids": np.array([block], np.int64),
                 "position_ids": np.arange(done, done + len(block), dtype=np.int64)[None],
                 **caches}
        if is_static:
            feeds["cache_lengths"] = np.array([done], np.int64)
        else:
            feeds["attention_mask"] = np.ones((1, done + len(block)), np.int64)
        names = [o.name for o in session.get_outputs()]
        out = dict(zip(names, session.run(None, feeds), strict=True))
        rows.append(out["logits"][0].astype(np.float64))
        caches = {name: out[name.replace("past_key_values", "present")] for name in caches}
        done += len(block)
    return np.concatenate(rows)
