"""Tiny random Gemma 2, Gemma 3 and Phi-3 checkpoints written in code, the configuration each
``config.json`` describes (written from the architecture's description, not from the
importer) for the one numpy reference (export_reference.target_forward), and a runner that
takes an imported package's logits through its own caches.

    folder = write_hf_folder(tmp / "hf", "gemma2")     # config.json + model.safetensors
    path = write_gguf_file(tmp / "m.gguf", "gemma2")   # as llama.cpp's converter writes it
    expected = reference_logits(HF_CONFIGS["gemma2"], hf_weights("gemma2"), IDS)
    actual = package_logits(import_model(folder, tmp / "p"), IDS, PREFILL)

Each model has a sliding window (3) smaller than the sequence (:data:`IDS`, 10 tokens), so
the window changes the logits; Gemma 3 has six layers, the sixth global, and a global RoPE
base far from the local one.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import onnxruntime as ort
from gguf import GGMLQuantizationType as Q
from gguf_models import BOS_ID, CHAT_TEMPLATE, EOS_ID, MERGES, SPECIALS, TOKENS

from export.export_reference import target_forward
from speculant_tools.export import LlamaConfig, RopeScaling
from speculant_tools.export.config import FULL, SLIDING
from speculant_tools.importers.gguf_vocab import build_tokenizer

IDS = [7, 3, 41, 12, 25, 9, 30, 5, 18, 44]  # prefill PREFILL of them, then one per step
PREFILL = 7
# longer than the longrope variants' original context (16) and within their context (64)
LONG_IDS = IDS + [21, 6, 38, 14, 27, 2, 33, 19, 45, 10, 29, 4, 36, 16]
COMMON = {"vocab_size": len(TOKENS), "hidden_size": 32, "intermediate_size": 64,
          "max_position_embeddings": 64, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
          "pad_token_id": 0, "attention_bias": False, "torch_dtype": "float32"}
HF_CONFIGS = {
    "gemma2": {**COMMON, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
               "rope_theta": 10000.0, "query_pre_attn_scalar": 24, "sliding_window": 3,
               "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
               "tie_word_embeddings": True},
    "gemma3": {**COMMON, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
               "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 1,
               "head_dim": 16, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
               "rope_theta": 100.0, "rope_local_base_freq": 10000.0,
               "query_pre_attn_scalar": 16, "sliding_window": 3, "sliding_window_pattern": 6,
               "attn_logit_softcapping": None, "final_logit_softcapping": None,
               "rope_scaling": None, "tie_word_embeddings": True},
    "phi3": {**COMMON, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
             "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
             "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
             "rope_scaling": None, "original_max_position_embeddings": 64,
             "sliding_window": 3, "tie_word_embeddings": False},
}
# the scaled variants: Gemma 3 4B-27B's linear scaling on the global layers; Phi-3 128k's
# longrope, short factors (the sequence stays under the original context, 16)
HF_CONFIGS["gemma3-linear"] = {**HF_CONFIGS["gemma3"],
                               "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
HF_CONFIGS["phi3-longrope"] = {**HF_CONFIGS["phi3"], "original_max_position_embeddings": 16,
                               "rope_scaling": {"type": "longrope",
                                                "short_factor": [1.0, 1.5, 2.0, 3.5, 1.2,
                                                                 4.0, 8.0, 2.5],
                                                "long_factor": [9.0] * 8}}
# a longrope checkpoint without long factors: the short ones at every length, capped
HF_CONFIGS["phi3-longrope-short"] = {**HF_CONFIGS["phi3-longrope"], "rope_scaling": {
    "type": "longrope", "short_factor": HF_CONFIGS["phi3-longrope"]["rope_scaling"][
        "short_factor"]}}
# Phi-4-mini's form: partial rotary (48 of 64 values turned; GroupQueryAttention takes
# multiples of 16) with longrope (24 pairs)
HF_CONFIGS["phi3-partial-longrope"] = {
    **HF_CONFIGS["phi3-longrope"], "hidden_size": 128, "partial_rotary_factor": 0.75,
    "rope_scaling": {"type": "longrope", "short_factor": list(np.linspace(1.0, 12.0, 24)),
                     "long_factor": [9.0] * 24}}
GGUF_ARCHS = {"gemma2": "gemma2", "gemma3": "gemma3", "phi3": "phi3", "gemma3-linear": "gemma3",
              "phi3-longrope": "phi3", "phi3-partial-longrope": "phi3",
              "phi3-longrope-short": "phi3"}


def base_family(family: str) -> str:
    return family.split("-")[0]


def head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def rotary_dim(cfg: dict) -> int:
    """The values RoPE turns: transformers' int(head_dim * partial_rotary_factor)."""
    return int(head_dim(cfg) * cfg.get("partial_rotary_factor", 1.0))


def is_gemma(cfg: dict) -> bool:
    return cfg["model_type"].startswith("gemma")


def hf_weights(family: str, seed: int = 11) -> dict[str, np.ndarray]:
    """Random float32 weights under the family's own Hugging Face names (Phi-3's fused)."""
    cfg, family = HF_CONFIGS[family], base_family(family)
    rng = np.random.default_rng(seed)
    h, f, d = cfg["hidden_size"], cfg["intermediate_size"], head_dim(cfg)
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (1.5 * rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(size: int) -> np.ndarray:  # Gemma scales by 1 + w
        base = 0.0 if is_gemma(cfg) else 1.0
        return (base + 0.2 * rng.standard_normal(size)).astype(np.float32)

    weights = {"model.embed_tokens.weight": rng.standard_normal((cfg["vocab_size"], h))
               .astype(np.float32), "model.norm.weight": norm(h)}
    if not cfg["tie_word_embeddings"]:
        weights["lm_head.weight"] = matrix(cfg["vocab_size"], h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        weights.update({f"{p}.input_layernorm.weight": norm(h),
                        f"{p}.post_attention_layernorm.weight": norm(h),
                        f"{p}.self_attn.o_proj.weight": matrix(h, q),
                        f"{p}.mlp.down_proj.weight": matrix(h, f)})
        if family == "phi3":
            weights[f"{p}.self_attn.qkv_proj.weight"] = matrix(q + 2 * kv, h)
            weights[f"{p}.mlp.gate_up_proj.weight"] = matrix(2 * f, h)
            continue
        weights.update({f"{p}.self_attn.q_proj.weight": matrix(q, h),
                        f"{p}.self_attn.k_proj.weight": matrix(kv, h),
                        f"{p}.self_attn.v_proj.weight": matrix(kv, h),
                        f"{p}.mlp.gate_proj.weight": matrix(f, h),
                        f"{p}.mlp.up_proj.weight": matrix(f, h),
                        f"{p}.pre_feedforward_layernorm.weight": norm(h),
                        f"{p}.post_feedforward_layernorm.weight": norm(h)})
        if family == "gemma3":
            weights[f"{p}.self_attn.q_norm.weight"] = norm(d)
            weights[f"{p}.self_attn.k_norm.weight"] = norm(d)
    return weights


def tokenizer_json() -> str:
    types = [3 if t in SPECIALS else 1 for t in TOKENS]
    return build_tokenizer(TOKENS, MERGES, types, pre="smollm", bos_id=BOS_ID,
                           add_bos=False).to_str()


def write_hf_folder(folder: Path, family: str, config: dict | None = None) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    save_file(hf_weights(family), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config or HF_CONFIGS[family]))
    (folder / "tokenizer.json").write_text(tokenizer_json())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": TOKENS[BOS_ID], "eos_token": TOKENS[EOS_ID],
         "chat_template": CHAT_TEMPLATE}))
    return folder


# -- GGUF, as llama.cpp's convert_hf_to_gguf.py writes these families ---------------------
GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "self_attn.qkv_proj": "attn_qkv", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}


def _gguf_name(name: str, family: str) -> str:
    if name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        return {"model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}[name]
    _, _, layer, rest = name.split(".", 3)
    rest = rest.removesuffix(".weight")
    if rest == "post_attention_layernorm":  # Llama's pre-MLP norm; Gemma's attention output's
        short = "post_attention_norm" if family.startswith("gemma") else "ffn_norm"
    else:
        short = GGUF_LAYER_NAMES[rest]
    return f"blk.{layer}.{short}.weight"


def gguf_config(family: str) -> dict:
    """The Hugging Face configuration a GGUF of ``family`` amounts to: llama.cpp derives
    Gemma's attention scale from head_dim (below 27B) and fixes Gemma 3's local base."""
    cfg = dict(HF_CONFIGS[family])
    if family.startswith("gemma"):
        cfg["query_pre_attn_scalar"] = head_dim(cfg)
    return cfg


def write_gguf_file(path: Path, family: str, extra: dict[str, np.ndarray] | None = None
                    ) -> Path:
    """``hf_weights(family)`` in a GGUF of the family's architecture (float32 tensors):
    Gemma's norms stored as ``1 + w``, q/k rows unpermuted, Phi-3's fused weights kept."""
    cfg = gguf_config(family)
    arch = GGUF_ARCHS[family]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(head_dim(cfg))
    writer.add_value_length(head_dim(cfg))
    writer.add_rope_dimension_count(rotary_dim(cfg))
    writer.add_rope_freq_base(cfg["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_sliding_window(cfg["sliding_window"])
    rope = cfg.get("rope_scaling") or {}
    if "factor" in rope:  # linear: what the converter writes
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    if "short_factor" in rope:  # longrope: the converter's keys and factor tensors
        original = cfg["original_max_position_embeddings"]
        scale = cfg["max_position_embeddings"] / original
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_rope_scaling_attn_factors(np.sqrt(1 + np.log(scale) / np.log(original)))
        factors = {"rope_factors_long.weight": rope.get("long_factor"),
                   "rope_factors_short.weight": rope["short_factor"]}
        extra = {**{name: np.array(values) for name, values in factors.items()
                    if values is not None}, **(extra or {})}
    if cfg.get("attn_logit_softcapping"):
        writer.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
    if cfg.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in TOKENS])
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, array in hf_weights(family).items():
        if is_gemma(cfg) and name.endswith("norm.weight"):
            array = array + np.float32(1.0)  # the converter's norm shift
        writer.add_tensor(_gguf_name(name, family), array.astype(np.float32), raw_dtype=Q.F32)
    for name, array in (extra or {}).items():
        writer.add_tensor(name, array.astype(np.float32), raw_dtype=Q.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# -- the reference ----------------------------------------------------------------------------
def expected_config(cfg: dict, sliding: bool = True) -> LlamaConfig:
    """The configuration ``cfg`` (a ``config.json`` mapping of Gemma 2, Gemma 3 or Phi-3)
    describes, written from each architecture's description (transformers' modeling files),
    not from the importer. ``sliding=False`` drops the window (to show that it matters)."""
    h, d, num_layers = cfg["hidden_size"], head_dim(cfg), cfg["num_hidden_layers"]
    sizes = {name: cfg[name] for name in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "intermediate_size", "max_position_embeddings", "rms_norm_eps",
        "rope_theta")}
    window = cfg["sliding_window"] if sliding else None
    rope = cfg.get("rope_scaling")
    if not is_gemma(cfg):  # Phi-3: Llama, untied, every layer sliding
        if rope:  # longrope: the short factors, the long ones beyond the original context
            original = cfg["original_max_position_embeddings"]
            scale = sizes["max_position_embeddings"] / original
            factor = float(np.sqrt(1 + np.log(scale) / np.log(original)))
            long = rope.get("long_factor")
            if long is None:  # the short factors alone: the context capped at the original
                sizes["max_position_embeddings"] = original
            rope = RopeScaling("longrope", frequency_factors=tuple(rope["short_factor"]),
                               attention_factor=factor, long_factors=long and tuple(long),
                               original_max_position_embeddings=long and original)
        return LlamaConfig(**sizes, head_dim=d, tie_word_embeddings=False,
                           sliding_window=window, rope_scaling=rope,
                           rotary_dim=rotary_dim(cfg) if rotary_dim(cfg) < d else None)
    types = tuple(SLIDING if is_sliding(cfg, i) else FULL for i in range(num_layers))
    gemma3 = cfg["model_type"] == "gemma3_text"
    return LlamaConfig(
        **sizes, head_dim=d, embedding_multiplier=float(np.sqrt(h)), norm_weight_offset=1.0,
        hidden_act="gelu_pytorch_tanh", post_norms=True, qk_norm=gemma3,
        attn_logit_softcapping=cfg.get("attn_logit_softcapping"),
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
        query_pre_attn_scalar=cfg["query_pre_attn_scalar"], sliding_window=window,
        layer_types=types if sliding else None,
        rope_local_base_freq=cfg.get("rope_local_base_freq") if gemma3 else None,
        rope_scaling=rope and RopeScaling("linear", factor=rope["factor"]))  # global layers


def is_sliding(cfg: dict, layer: int) -> bool:
    if cfg.get("sliding_window") is None:
        return False
    if cfg["model_type"] == "gemma2":
        return layer % 2 == 0
    if cfg["model_type"] == "gemma3_text":
        return (layer + 1) % cfg.get("sliding_window_pattern", 6) != 0
    return True  # Phi-3: every layer


def reference_logits(cfg: dict, weights: dict[str, np.ndarray], ids: list[int],
                     sliding: bool = True, blocks: list[int] | None = None) -> np.ndarray:
    """Logits [T, vocab] float64 of the whole sequence ``ids`` from ``cfg`` and its own
    weights (Phi-3's fused q/k/v and gate/up split by rows), by the one numpy reference of
    the exported architecture (export_reference.target_forward), computed by forward calls
    of ``blocks`` tokens (default one: they choose longrope's tables)."""
    config = expected_config(cfg, sliding)
    q_rows = config.num_attention_heads * config.head_dim
    kv_rows, f = config.num_key_value_heads * config.head_dim, config.intermediate_size
    split = {}
    for name, array in weights.items():
        if name.endswith("self_attn.qkv_proj.weight"):
            prefix = name.removesuffix("qkv_proj.weight")
            for part, rows in zip("qkv", np.split(array, [q_rows, q_rows + kv_rows]),
                                  strict=True):
                split[f"{prefix}{part}_proj.weight"] = rows
        elif name.endswith("mlp.gate_up_proj.weight"):
            prefix = name.removesuffix("gate_up_proj.weight")
            split[f"{prefix}gate_proj.weight"], split[f"{prefix}up_proj.weight"] = \
                np.split(array, [f])
        else:
            split[name] = array
    return target_forward(config, split, ids, blocks=blocks)[0]


# -- the package's logits, through its own caches ----------------------------------------
def package_logits(root: Path, ids: list[int], prefill: int, capacity: int = 32,
                   provider: str = "CPUExecutionProvider") -> np.ndarray:
    """Logits [T, vocab] float64 of ``root``'s decoder: ``ids[:prefill]`` in one pass, then
    one token per pass, each pass fed the caches the previous one returned (appended: the
    presents; static: the buffers, ``cache_lengths`` the tokens before the pass). On CUDA
    with TF32 off: float32 is compared in float32 (docs/design/residency.md), where ONNX
    Runtime's CUDA EP would otherwise round matmul inputs to TF32's 10-bit mantissa."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    providers = [(provider, {"use_tf32": "0"}) if provider == "CUDAExecutionProvider"
                 else provider]
    session = ort.InferenceSession(str(root / "decoder" / "model.onnx"), options,
                                   providers=providers)
    inputs = {i.name: i for i in session.get_inputs()}
    is_static = "cache_lengths" in inputs
    dtype = np.float16 if "float16" in inputs["past_key_values.0.key"].type else np.float32
    past = {}
    for name, info in inputs.items():
        if name.startswith("past_key_values."):
            kv, d = info.shape[1], info.shape[3]
            past[name] = np.zeros((1, kv, capacity if is_static else 0, d), dtype)
    rows, start = [], 0
    for block in [ids[:prefill], *([t] for t in ids[prefill:])]:
        feed = {"input_ids": np.array([block], np.int64),
                "position_ids": np.arange(start, start + len(block), dtype=np.int64)[None],
                **past}
        if is_static:
            feed["cache_lengths"] = np.array([start], np.int64)
        else:
            feed["attention_mask"] = np.ones((1, start + len(block)), np.int64)
        names = [o.name for o in session.get_outputs()]
        outputs = dict(zip(names, session.run(names, feed), strict=True))
        rows.append(outputs["logits"][0].astype(np.float64))
        past = {name: outputs[name.replace("past_key_values", "present")] for name in past}
        start += len(block)
    return np.concatenate(rows)
