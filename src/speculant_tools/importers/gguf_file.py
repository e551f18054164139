"""Read a GGUF file of the Llama family into a :class:`Checkpoint` (the ``gguf`` package).

Tensors are dequantized exactly as ggml does (``gguf.quants.dequantize``: Q4_0, Q4_1, Q8_0,
F16, F32). llama.cpp's converter permutes the rows of ``attn_q`` and ``attn_k`` so that its
rotary kernel rotates adjacent pairs; Hugging Face's Llama rotates halves, so the import
undoes that permutation (:func:`unpermute_rows`). Sizes, the tokenizer, its special tokens,
EOS/BOS and the chat template come from the GGUF's metadata.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from speculant_tools.export import ExportError, LlamaConfig
from speculant_tools.importers.checkpoint import (
    Checkpoint,
    ImporterError,
    Progress,
    tokenizer_config,
)
from speculant_tools.importers.gguf_vocab import build_tokenizer

ARCHITECTURES = ("llama",)
QUANT_TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")
LAYER_NAMES = {  # GGUF blk.{i}.NAME -> HF model.layers.{i}.NAME
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def permute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's ``permute`` (convert_hf_to_gguf.py): per head, rows of the two rotary
    halves interleaved. ``weight`` [num_heads * head_dim, in]."""
    return (weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def unpermute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """The inverse of :func:`permute_rows`: back to Hugging Face's halves layout."""
    return (weight.reshape(num_heads, weight.shape[0] // num_heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


class _Fields:
    """The GGUF's key-value metadata, read with typed errors naming the key."""

    def __init__(self, reader: Any, file: str) -> None:
        self.fields, self.file = reader.fields, file

    def get(self, key: str, default: Any = None) -> Any:
        field = self.fields.get(key)
        return default if field is None else field.contents()

    def need(self, key: str) -> Any:
        if key not in self.fields:
            raise ImporterError("the GGUF lacks a required key", file=self.file, path=key)
        return self.get(key)


def read_gguf(path: str | Path, progress: Progress | None = None) -> Checkpoint:
    """The Llama checkpoint in the GGUF file ``path`` (float32 weights, HF names)."""
    import gguf

    path = Path(path)
    file = str(path)
    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as error:
        raise ImporterError(f"cannot read the GGUF file: {error}", file=file) from None
    fields = _Fields(reader, file)
    config = _config(fields)
    weights = _weights(reader, config, file, progress)
    return Checkpoint(config=config, weights=weights, source=file,
                      **_tokenizer(fields, config))


def _config(fields: _Fields) -> LlamaConfig:
    arch = fields.need("general.architecture")
    if arch not in ARCHITECTURES:
        raise ImporterError("this architecture is not supported", file=fields.file,
                            path="general.architecture", value=arch,
                            expected=" or ".join(ARCHITECTURES))
    scaling = fields.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "linear") or (
            scaling == "linear" and fields.get(f"{arch}.rope.scaling.factor", 1.0) != 1.0):
        raise ImporterError("rope scaling is not supported", file=fields.file,
                            path=f"{arch}.rope.scaling.type", value=scaling,
                            expected="none (plain RoPE)")
    heads = fields.need(f"{arch}.attention.head_count")
    hidden = fields.need(f"{arch}.embedding_length")
    head_dim = fields.get(f"{arch}.attention.key_length", hidden // heads)
    for key in (f"{arch}.rope.dimension_count", f"{arch}.attention.value_length"):
        if fields.get(key, head_dim) != head_dim:
            raise ImporterError("partial rotary or a value width other than the key's is not "
                                "supported", file=fields.file, path=key, value=fields.get(key),
                                expected=str(head_dim))
    tokens = fields.need("tokenizer.ggml.tokens")
    try:
        return LlamaConfig(
            vocab_size=int(fields.get(f"{arch}.vocab_size", len(tokens))), hidden_size=hidden,
            num_hidden_layers=fields.need(f"{arch}.block_count"), num_attention_heads=heads,
            num_key_value_heads=fields.get(f"{arch}.attention.head_count_kv", heads),
            intermediate_size=fields.need(f"{arch}.feed_forward_length"),
            max_position_embeddings=fields.need(f"{arch}.context_length"), head_dim=head_dim,
            rms_norm_eps=_decimal(fields.need(f"{arch}.attention.layer_norm_rms_epsilon")),
            rope_theta=_decimal(fields.get(f"{arch}.rope.freq_base", 10000.0)))
    except ExportError as error:
        raise ImporterError(f"{error}", file=fields.file) from None


def _decimal(value: float) -> float:
    """A GGUF float32 as the shortest decimal that rounds to it (1e-05, not 9.99999974e-06),
    as the checkpoint's config.json had it."""
    return float(str(np.float32(value)))


def _hf_name(name: str) -> str | None:
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    return None


def _weights(reader: Any, config: LlamaConfig, file: str,
             progress: Progress | None) -> dict[str, np.ndarray]:
    from gguf import quants

    weights: dict[str, np.ndarray] = {}
    total = len(reader.tensors)
    for index, tensor in enumerate(reader.tensors):
        name, kind = tensor.name, tensor.tensor_type.name
        hf_name = _hf_name(name)
        if hf_name is None:
            raise ImporterError("this tensor is outside the Llama architecture (rope "
                                "frequencies, biases, ...)", file=file,
                                path=f"tensors.{name}", expected="the Llama weights")
        if kind not in QUANT_TYPES:
            raise ImporterError("this tensor type is not supported", file=file,
                                path=f"tensors.{name}.type", value=kind,
                                expected=", ".join(QUANT_TYPES))
        array = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists ne0 first
        array = array.reshape(shape)
        if name.endswith("attn_q.weight"):
            array = unpermute_rows(array, config.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            array = unpermute_rows(array, config.num_key_value_heads)
        weights[hf_name] = np.ascontiguousarray(array)
        if progress is not None:
            progress(f"dequantizing {name} ({kind})", index + 1, total)
    return weights


def _tokenizer(fields: _Fields, config: LlamaConfig) -> dict[str, Any]:
    model = fields.need("tokenizer.ggml.model")
    if model != "gpt2":
        raise ImporterError("only gpt2-style byte-level BPE tokenizers are supported",
                            file=fields.file, path="tokenizer.ggml.model", value=model,
                            expected="gpt2")
    tokens = list(fields.need("tokenizer.ggml.tokens"))
    if len(tokens) > config.vocab_size:
        raise ImporterError("the tokenizer has more tokens than the model has rows",
                            file=fields.file, path="tokenizer.ggml.tokens", value=len(tokens),
                            expected=f"at most {config.vocab_size}")
    types = list(fields.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    bos_id = fields.get("tokenizer.ggml.bos_token_id")
    eos_id = fields.need("tokenizer.ggml.eos_token_id")
    for key, token_id in (("bos_token_id", bos_id), ("eos_token_id", eos_id)):
        if token_id is not None and not 0 <= token_id < len(tokens):
            raise ImporterError("a special token id outside the vocabulary", file=fields.file,
                                path=f"tokenizer.ggml.{key}", value=token_id)
    add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", False))
    tokenizer = build_tokenizer(tokens, list(fields.get("tokenizer.ggml.merges", [])), types,
                                pre=fields.get("tokenizer.ggml.pre", "default"),
                                bos_id=bos_id, add_bos=add_bos)
    bos = tokens[bos_id] if bos_id is not None else None
    extra: dict[str, Any] = {"add_bos_token": add_bos, "add_eos_token": False,
                             "model_max_length": config.max_position_embeddings,
                             "clean_up_tokenization_spaces": False}
    unknown = fields.get("tokenizer.ggml.unknown_token_id")
    if unknown is not None and 0 <= unknown < len(tokens):
        extra["unk_token"] = tokens[unknown]
    padding = fields.get("tokenizer.ggml.padding_token_id")
    if padding is not None and 0 <= padding < len(tokens):
        extra["pad_token"] = tokens[padding]
    return {"tokenizer_json": tokenizer.to_str(),
            "tokenizer_config": tokenizer_config(fields.get("tokenizer.chat_template"),
                                                 bos, tokens[eos_id], extra),
            "eos_id": int(eos_id)}
