"""Tiny GGUF files of a 2-layer Llama, written in code with ``gguf.GGUFWriter``.

The weights are random (HF names and layout, fixed seed); each tensor is stored in one of the
five supported types and q/k rows are permuted as llama.cpp's converter does, with the
converter's own ``permute`` written out here (not the importer's inverse). ``stored_weights``
are the HF-layout weights the GGUF holds after quantization: the oracle of every test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

from speculant_tools.export import LlamaConfig, target_shapes

CONFIG = LlamaConfig(vocab_size=48, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                     head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
BASE = SPECIALS + LETTERS + ["Ġ", "Ċ", "0", "1", "2"]
MERGES = ["Ġ a", "a b", "Ġ t", "h e", "Ġt he"]
TOKENS = BASE + ["Ġa", "ab", "Ġt", "he", "Ġthe"]
TOKENS += [f"<unused{i}>" for i in range(CONFIG.vocab_size - len(TOKENS))]
BOS_ID, EOS_ID = 1, 2
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")
# HF name suffix -> stored type: all five types appear in every layer
TYPES = {"embed_tokens": Q.Q8_0, "q_proj": Q.Q4_0, "k_proj": Q.Q4_1, "v_proj": Q.Q8_0,
         "o_proj": Q.F16, "gate_proj": Q.Q4_1, "up_proj": Q.Q4_0, "down_proj": Q.F32}
GGUF_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def llama_cpp_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py's ``LlamaModel.permute``, verbatim."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def random_weights(seed: int = 7, config: LlamaConfig = CONFIG) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in target_shapes(config).items():
        if len(shape) == 1:
            weights[name] = 1.0 + 0.1 * rng.standard_normal(shape)
            if name == "model.norm.weight":
                weights[name] *= rng.choice([-1.0, 1.0], shape)
        elif name == "model.embed_tokens.weight":
            weights[name] = 2.0 * rng.standard_normal(shape)
        else:
            weights[name] = 2.0 * rng.standard_normal(shape) / np.sqrt(shape[1])
    return {name: array.astype(np.float32) for name, array in weights.items()}


def _kind(name: str) -> Q:
    if name.endswith("norm.weight"):
        return Q.F32
    return next(kind for key, kind in TYPES.items() if f"{key}.weight" in name)


def _gguf_name(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = name.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[rest.removesuffix('.weight')]}.weight"


def _stored(array: np.ndarray, kind: Q) -> np.ndarray:
    """What the file holds for ``array``: quantized bytes, float16, float32 or float64; for a
    type gguf cannot quantize in numpy, random valid blocks of the same shape."""
    if kind in FLOATS:
        return array.astype(FLOATS[kind])
    try:
        return quants.quantize(array, kind)
    except NotImplementedError:
        seed = int(np.abs(array).sum() * 1e6) % (1 << 32)  # distinct tensors, distinct bytes
        return random_blocks(array.shape, kind, np.random.default_rng(seed))


FLOATS = {Q.F32: np.float32, Q.F16: np.float16, Q.F64: np.float64}
BLOCK_BOUND = 2.0  # random blocks are drawn until each dequantizes to |x| <= this


def random_blocks(shape: tuple[int, ...], kind: Q, rng: np.random.Generator) -> np.ndarray:
    """Bytes of ``kind`` for a tensor of ``shape`` (ne0 last): uniform random bytes, each
    block drawn again until gguf dequantizes it to finite values within BLOCK_BOUND (so every
    float16 scale is a valid, moderate number). Types gguf cannot dequantize: random bytes."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
    blocks = rng.integers(0, 256, (int(np.prod(shape)) // block_size, type_size), np.uint8)
    for _ in range(1000):
        try:
            with np.errstate(all="ignore"):
                values = quants.dequantize(blocks, kind).reshape(len(blocks), -1)
        except NotImplementedError:
            break
        bad = ~(np.isfinite(values) & (np.abs(values) <= BLOCK_BOUND)).all(axis=1)
        if not bad.any():
            break
        blocks[bad] = rng.integers(0, 256, (int(bad.sum()), type_size), np.uint8)
    return blocks.reshape(*shape[:-1], shape[-1] // block_size * type_size)


def stored_weights(weights: dict[str, np.ndarray],
                   kinds: dict[str, Q] | None = None) -> dict[str, np.ndarray]:
    """The HF-layout weights a reader of the file gets back (quantization applied)."""
    out = {}
    for name, array in weights.items():
        kind = (kinds or {}).get(name, _kind(name))
        stored = _stored(array, kind)
        values = stored if kind in FLOATS else quants.dequantize(stored, kind)
        out[name] = np.asarray(values, np.float32).reshape(array.shape)
    return out


def write_gguf(path: Path, weights: dict[str, np.ndarray], *, arch: str = "llama",
               edit: Callable[[gguf.GGUFWriter], None] | None = None,
               kinds: dict[str, Q] | None = None, permute: bool = True,
               tokenizer_model: str = "gpt2", config: LlamaConfig = CONFIG,
               vocabulary: Callable[[gguf.GGUFWriter], None] | None = None) -> Path:
    """A GGUF of ``weights`` (HF names) as llama.cpp's converter writes one. ``edit`` adds
    keys (an unsupported field); ``kinds`` overrides the stored type per HF name;
    ``vocabulary`` writes the tokenizer keys in place of the gpt2 one here."""
    c = config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_vocab_size(c.vocab_size)
    if vocabulary is not None:
        vocabulary(writer)
    else:
        writer.add_tokenizer_model(tokenizer_model)
        writer.add_tokenizer_pre("smollm")
        writer.add_token_list(TOKENS)
        writer.add_token_types([3 if t in SPECIALS else 1 for t in TOKENS])
        writer.add_token_merges(MERGES)
        writer.add_bos_token_id(BOS_ID)
        writer.add_eos_token_id(EOS_ID)
        writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    if edit is not None:
        edit(writer)
    for name, array in weights.items():
        if permute and name.endswith("q_proj.weight"):
            array = llama_cpp_permute(array, c.num_attention_heads, c.num_attention_heads)
        elif permute and name.endswith("k_proj.weight"):
            array = llama_cpp_permute(array, c.num_attention_heads, c.num_key_value_heads)
        kind = (kinds or {}).get(name, _kind(name))
        writer.add_tensor(_gguf_name(name), _stored(array, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
