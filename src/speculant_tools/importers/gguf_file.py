"""Read a GGUF file of a family of :mod:`~speculant_tools.importers.families`
(``general.architecture`` ``llama``, ``qwen2``, ``qwen3``, ``gemma2``, ``gemma3``,
``phi3``) into a :class:`Checkpoint` (the ``gguf`` package).

Tensors are dequantized exactly as ggml does, by gguf's own code, one tensor at a time
(``gguf_quant``: every type gguf dequantizes); the blocks of the types ONNX Runtime's
MatMulNBits computes with exactly (Q4_0, Q3_K) are also kept (``Checkpoint.kept``).
llama.cpp's converter permutes the rows of ``attn_q`` and ``attn_k`` (and their biases) so
that its rotary kernel rotates adjacent pairs; Hugging Face's Llama rotates halves, so the
import undoes that permutation (:func:`unpermute_rows`; the ``llama`` architecture's alone).
Sizes, RoPE scaling (``rope.scaling.type`` linear, llama3's per-frequency
``rope_freqs.weight``, or Phi-3's longrope factors: :mod:`~speculant_tools.importers.longrope`),
the tokenizer, its special tokens, EOS/BOS and the chat template
come from the GGUF's metadata; the biases and an untied ``output.weight`` from the tensors
the file holds (as llama.cpp reads them).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from speculant_tools.export import ExportError, LlamaConfig, RopeScaling, target_shapes
from speculant_tools.export.config import EMBEDDING, LM_HEAD
from speculant_tools.importers.checkpoint import (
    Checkpoint,
    ImporterError,
    Progress,
    max_positions,
    tokenizer_config,
)
from speculant_tools.importers.families import (
    BY_GGUF_ARCH,
    ROPE_REMEDY,
    Family,
    fused_shapes,
    split_fused,
)
from speculant_tools.importers.gguf_header import REMEDY, check_header, printable
from speculant_tools.importers.gguf_quant import NBits, can_dequantize, dequantize, nbits_of
from speculant_tools.importers.gguf_vocab import build_tokenizer, default_add_bos
from speculant_tools.importers.longrope import LONGROPE, gguf_longrope

ARCHITECTURES = tuple(BY_GGUF_ARCH)
FAMILIES_REMEDY = "docs/models.md lists the families and fields that import"
ROPE_FREQS = "rope_freqs.weight"  # llama3 scaling: frequency i divided by rope_freqs[i]
ROPE_REMEDY_GGUF = ("remove the scaling keys to run the model at its original context: "
                    "gguf-new-metadata --remove-metadata {key} IN OUT (the gguf package), "
                    "or import the Hugging Face folder after: " + ROPE_REMEDY)
TYPE_REMEDY = ("re-quantize it with llama.cpp (llama-quantize --allow-requantize IN OUT Q4_K_M, "
               "or Q8_0), or import the model's Hugging Face folder")
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
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
}
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                "output_norm.weight": "model.norm.weight", "output.weight": LM_HEAD}
CONFIG_KEYS = {  # LlamaConfig field -> the GGUF key it is read from
    "vocab_size": "{arch}.vocab_size", "hidden_size": "{arch}.embedding_length",
    "num_hidden_layers": "{arch}.block_count", "head_dim": "{arch}.attention.key_length",
    "num_attention_heads": "{arch}.attention.head_count",
    "num_key_value_heads": "{arch}.attention.head_count_kv",
    "intermediate_size": "{arch}.feed_forward_length",
    "max_position_embeddings": "{arch}.context_length",
    "rotary_dim": "{arch}.rope.dimension_count"}


def permute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's ``permute`` (convert_hf_to_gguf.py): per head, rows of the two rotary
    halves interleaved. ``weight`` [num_heads * head_dim, in]."""
    return (weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def unpermute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """The inverse of :func:`permute_rows`: back to Hugging Face's halves layout."""
    return (weight.reshape(num_heads, weight.shape[0] // num_heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


MISSING = object()  # a required key's default
# what gguf's reader raises on a file check_header passed all the same (a bug there or here)
READER_ERRORS = (OSError, ValueError, IndexError, KeyError, TypeError, OverflowError,
                 MemoryError)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


class _Fields:
    """The GGUF's key-value metadata, each value read as the type the importer needs, with
    typed errors naming the file and the key."""

    def __init__(self, reader: Any, file: str) -> None:
        self.fields, self.file = reader.fields, file

    def refuse(self, key: str, message: str, value: Any = None, expected: str = "",
               remedy: str = REMEDY) -> ImporterError:
        return ImporterError(message, file=self.file, path=key, value=value,
                             expected=expected, remedy=remedy)

    def _read(self, key: str, default: Any, expected: str, is_valid) -> Any:
        if key not in self.fields:
            if default is MISSING:
                raise self.refuse(key, "the GGUF lacks a required key", expected=expected)
            return default
        try:
            value = self.fields[key].contents()
        except (ValueError, IndexError, TypeError) as error:  # UnicodeDecodeError among them
            raise self.refuse(key, f"cannot read the value: {error}", expected=expected) \
                from None
        if not is_valid(value):
            raise self.refuse(key, f"the value must be {expected}", value, expected)
        return value

    def count(self, key: str, default: Any = MISSING) -> int:
        return self._read(key, default, "a positive integer",
                          lambda v: _is_int(v) and v > 0)

    def integer(self, key: str, default: Any = MISSING) -> int:
        return self._read(key, default, "an integer", _is_int)

    def positive(self, key: str, default: Any = MISSING) -> float:
        return self._read(key, default, "a positive finite number",
                          lambda v: _is_number(v) and v > 0)

    def text(self, key: str, default: Any = MISSING) -> str:
        return self._read(key, default, "a string", lambda v: isinstance(v, str))

    def flag(self, key: str, default: Any = MISSING) -> bool:
        return self._read(key, default, "a boolean", lambda v: isinstance(v, bool))

    def texts(self, key: str, default: Any = MISSING) -> list[str]:
        return self._read(key, default, "an array of strings",
                          lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))

    def numbers(self, key: str, default: Any = MISSING) -> list[float]:
        return self._read(key, default, "an array of finite numbers",
                          lambda v: isinstance(v, list) and all(_is_number(x) for x in v))

    def integers(self, key: str, default: Any = MISSING) -> list[int]:
        return self._read(key, default, "an array of integers",
                          lambda v: isinstance(v, list) and all(_is_int(x) for x in v))


def read_gguf(path: str | Path, progress: Progress | None = None) -> Checkpoint:
    """The Llama checkpoint in the GGUF file ``path`` (float32 weights, HF names).

    Every size is checked against what the file holds before anything proportional to it
    is built: the header against the file (``gguf_header.check_header``), the tensors'
    names and shapes against the declared sizes, ``block_count`` against the layers
    present, ``context_length`` against the weights (:func:`_check_context`). Any failure
    is an :class:`ImporterError` naming the file and the field."""
    import gguf

    path = Path(path)
    file = str(path)
    check_header(path)
    try:
        reader = gguf.GGUFReader(path)
    except READER_ERRORS as error:
        raise ImporterError(f"gguf's reader refuses the file: {type(error).__name__}: "
                            f"{error}", file=file, path="GGUF", remedy=REMEDY) from None
    fields = _Fields(reader, file)
    arch = fields.text("general.architecture")
    if arch not in ARCHITECTURES:
        raise fields.refuse("general.architecture", "this architecture is not supported",
                            arch, " or ".join(ARCHITECTURES), remedy=FAMILIES_REMEDY)
    family = BY_GGUF_ARCH[arch]
    config = _config(fields, arch, family, reader.tensors)
    scaled = {ROPE_FREQS} if family.has_rope_scaling else set()
    if config.rope_scaling is not None and config.rope_scaling.rope_type == "longrope":
        scaled.update(LONGROPE)
    tensors = _checked_tensors([t for t in reader.tensors if t.name not in scaled],
                               config, fields)
    weights, kept = _weights(tensors, config, file, progress,
                             permuted=family.gguf_permutes_qk)
    if family.is_fused:
        weights = split_fused(config, weights)
        kept = {name: nbits for name, nbits in kept.items() if name in weights}
    if LM_HEAD in weights and np.array_equal(weights[LM_HEAD], weights[EMBEDDING]):
        del weights[LM_HEAD]  # written out although tied
        kept.pop(LM_HEAD, None)
        config = replace(config, tie_word_embeddings=True)
    return Checkpoint(config=config, weights=weights, source=file, kept=kept,
                      **_tokenizer(fields, config))


def _rope_scaling(fields: _Fields, arch: str, tensors: list[Any], rotated: int
                  ) -> RopeScaling | None:
    """Linear scaling from ``rope.scaling.type``/``factor``; llama3's as the per-frequency
    divisors llama.cpp's converter writes in ``rope_freqs.weight`` (``rotated`` / 2)."""
    key = f"{arch}.rope.scaling.type"
    scaling = fields.text(key, "none")
    if scaling not in ("none", "linear"):
        raise fields.refuse(key, f"RoPE scaling {scaling!r} is not supported", scaling,
                            "none or linear (llama3: rope_freqs.weight)",
                            remedy=ROPE_REMEDY_GGUF.format(key=key))
    factor = fields.positive(f"{arch}.rope.scaling.factor", 1.0)
    frequencies = [t for t in tensors if t.name == ROPE_FREQS]
    if not frequencies:
        return RopeScaling("linear", factor=factor) if scaling == "linear" and factor != 1.0 \
            else None
    tensor = frequencies[0]
    if tensor.tensor_type.name != "F32" or [int(n) for n in tensor.shape] != [rotated // 2]:
        raise fields.refuse(f"tensors.{ROPE_FREQS}", "the RoPE frequency factors must be one "
                            "F32 row of one value per rotated pair", (tensor.tensor_type.name,
                            [int(n) for n in tensor.shape]), f"F32 [{rotated // 2}]")
    if scaling == "linear" and factor != 1.0:
        raise fields.refuse(key, "linear scaling and rope_freqs.weight together", scaling,
                            "one of them")
    with np.errstate(all="ignore"):  # non-finite factors: refused by RopeScaling
        divisors = tuple(float(x) for x in np.asarray(tensor.data, np.float32).reshape(-1))
    return RopeScaling("factors", frequency_factors=divisors)


def _config(fields: _Fields, arch: str, family: Family, tensors: list[Any]) -> LlamaConfig:
    """The sizes and the family's variations; biases and an untied head as the file's
    tensors declare them (llama.cpp loads them where present)."""
    if not family.has_rope_scaling:
        scaling = fields.text(f"{arch}.rope.scaling.type", "none")
        if scaling not in ("none", "linear") or (scaling == "linear" and fields.positive(
                f"{arch}.rope.scaling.factor", 1.0) != 1.0):
            raise fields.refuse(f"{arch}.rope.scaling.type", "rope scaling is not supported "
                                f"for {family.name}", scaling, "none (plain RoPE)", remedy="")
    heads = fields.count(f"{arch}.attention.head_count")
    hidden = fields.count(f"{arch}.embedding_length")
    head_dim = fields.count(f"{arch}.attention.key_length", None) or hidden // heads
    if head_dim == 0:
        raise fields.refuse(f"{arch}.attention.head_count", "more attention heads than the "
                            "embedding has values (and no attention.key_length)", heads,
                            f"at most {hidden} (embedding_length)")
    key = f"{arch}.attention.value_length"
    if fields.count(key, head_dim) != head_dim:
        raise fields.refuse(key, "a value width other than the key's is not supported",
                            fields.count(key), str(head_dim), remedy="")
    rotary = fields.count(f"{arch}.rope.dimension_count", head_dim)  # partial rotary: fewer
    if rotary != head_dim and family.gguf_permutes_qk:  # rows interleaved over the head
        raise fields.refuse(f"{arch}.rope.dimension_count", "partial rotary is not supported "
                            "for this architecture", rotary, str(head_dim), remedy="")
    tokens = fields.texts("tokenizer.ggml.tokens")
    sizes: dict[str, Any] = {"vocab_size": fields.count(f"{arch}.vocab_size", len(tokens)),
             "hidden_size": hidden, "num_attention_heads": heads, "head_dim": head_dim,
             "num_hidden_layers": fields.count(f"{arch}.block_count"),
             "num_key_value_heads": fields.count(f"{arch}.attention.head_count_kv", heads),
             "intermediate_size": fields.count(f"{arch}.feed_forward_length"),
             "max_position_embeddings": fields.count(f"{arch}.context_length")}
    names = {tensor.name for tensor in tensors}
    variations = {"attention_bias": "blk.0.attn_q.bias" in names,
                  "attention_output_bias": "blk.0.attn_output.bias" in names,
                  "tie_word_embeddings": "output.weight" not in names,
                  "rotary_dim": None if rotary == head_dim else rotary,
                  **family.gguf_variations(fields, arch, sizes)}
    if family.has_rope_scaling:
        variations["rope_scaling"] = _rope_scaling(fields, arch, tensors, rotary)
    if LONGROPE[0] in names:
        variations["rope_scaling"] = gguf_longrope(fields, arch, tensors, sizes)
    try:
        return LlamaConfig(**sizes, rms_norm_eps=_float32(
            fields, f"{arch}.attention.layer_norm_rms_epsilon"), rope_theta=_float32(
            fields, f"{arch}.rope.freq_base", 10000.0), **variations)
    except ExportError as error:
        field = error.paths[0].removeprefix("config.").split(".")[0]
        frequencies = LONGROPE[0] if LONGROPE[0] in names else ROPE_FREQS
        key = f"tensors.{frequencies}" if field == "rope_scaling" else CONFIG_KEYS.get(
            field, "").format(arch=arch)
        raise fields.refuse(key, f"{error}", remedy="") from None


def _float32(fields: _Fields, key: str, default: Any = MISSING) -> float:
    """A positive float32 as the shortest decimal that rounds to it (1e-05, not
    9.99999974e-06), as the checkpoint's config.json had it."""
    value = fields.positive(key, default)
    with np.errstate(over="ignore", under="ignore"):  # out of range: refused below
        decimal = float(str(np.float32(value)))
    if not (math.isfinite(decimal) and decimal > 0):
        raise fields.refuse(key, "the value is outside float32's positive range", value,
                            "a positive float32")
    return decimal


def _hf_name(name: str, layer_names: dict[str, str] = LAYER_NAMES) -> str | None:
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isascii() and parts[1].isdigit() \
            and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}"
    return None


def _checked_tensors(tensors: list[Any], config: LlamaConfig,
                     fields: _Fields) -> list[tuple[Any, str]]:
    """(tensor, HF name) of each tensor, once every name is a Llama weight of a supported
    type and every shape is the one the declared sizes give (so the sizes are backed by the
    tensor data the file holds). ``block_count`` is checked against the tensors present
    before the expected shapes are listed (a list as long as the declared layers)."""
    arch = fields.text("general.architecture")
    layer_names = {**LAYER_NAMES, **BY_GGUF_ARCH[arch].gguf_layer_names}
    family = BY_GGUF_ARCH[arch]
    named = []
    for tensor in tensors:
        name, kind = printable(tensor.name), tensor.tensor_type.name
        hf_name = _hf_name(tensor.name, layer_names)
        if hf_name is None:
            raise fields.refuse(f"tensors.{name}", "this tensor is outside the exported "
                                "architecture (rope frequencies or factors, biases, ...)",
                                expected=f"the weights of a {arch} model",
                                remedy=FAMILIES_REMEDY)
        if not can_dequantize(kind):
            raise fields.refuse(f"tensors.{name}.type", "the gguf package cannot dequantize "
                                "this tensor type", kind, "a type gguf.quants dequantizes "
                                "(F32, F16, BF16, Q4_0 ... Q8_0, Q2_K ... Q6_K, IQ*, ...)",
                                remedy=TYPE_REMEDY)
        named.append((tensor, hf_name))
    num_layers = len({name.split(".")[2] for _, name in named
                      if name.startswith("model.layers.")})
    if config.num_hidden_layers != num_layers:
        raise fields.refuse(f"{arch}.block_count", "the file holds the tensors of another "
                            "number of layers", config.num_hidden_layers,
                            f"{num_layers} (the layers whose tensors the file holds)")
    shapes = target_shapes(config)
    if family.is_fused:  # q/k/v and gate/up as the file holds them
        shapes = fused_shapes(config, shapes)
    optional = set() if LM_HEAD in shapes else {LM_HEAD}
    shapes[LM_HEAD] = shapes[EMBEDDING]  # tied: an output.weight unequal is refused at export
    for tensor, hf_name in named:
        dims = [int(n) for n in tensor.shape]  # GGUF lists ne0 first
        if hf_name not in shapes or tuple(reversed(dims)) != shapes[hf_name]:
            expected = list(reversed(shapes[hf_name])) if hf_name in shapes else "no tensor"
            raise fields.refuse(f"tensors.{printable(tensor.name)}.dims", "the tensor "
                                "disagrees with the sizes the metadata declares "
                                "(embedding_length, vocab_size, head counts, key_length, "
                                "feed_forward_length)", dims, f"{expected} (ne0 first)")
    missing = sorted(set(shapes) - {name for _, name in named} - optional)
    if missing:
        raise fields.refuse("tensors", "the file lacks tensors of the declared model",
                            missing, "every Llama weight of the declared sizes")
    _check_context(config, sum(int(tensor.n_elements) for tensor, _ in named), fields)
    return named


def _check_context(config: LlamaConfig, num_weight_values: int, fields: _Fields) -> None:
    """``context_length`` within :func:`~speculant_tools.importers.checkpoint.max_positions`
    of the weights the file holds."""
    limit = max_positions(config, num_weight_values)
    key = f"{fields.text('general.architecture')}.context_length"
    if config.max_position_embeddings > limit:
        raise fields.refuse(key, "the context is out of proportion to the "
                            "weights the file holds (the export builds position tables of "
                            "context_length x head_dim values)",
                            config.max_position_embeddings, f"at most {limit}",
                            remedy="set the model's real context length: gguf-set-metadata "
                                   f"FILE {key} N (the gguf package)")


def _weights(tensors: list[tuple[Any, str]], config: LlamaConfig, file: str,
             progress: Progress | None, permuted: bool = True
             ) -> tuple[dict[str, np.ndarray], dict[str, NBits]]:
    """The float32 weights (HF names and layout), dequantized one tensor at a time by gguf,
    and the linear layers whose blocks stay quantized (``gguf_quant.nbits_of``).
    ``permuted``: q/k rows (and biases) as llama.cpp's Llama converter writes them, put back
    in halves."""
    weights: dict[str, np.ndarray] = {}
    kept: dict[str, NBits] = {}
    for index, (tensor, hf_name) in enumerate(tensors):
        name, kind = tensor.name, tensor.tensor_type.name  # a Llama weight's name
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists ne0 first
        try:
            with np.errstate(all="ignore"):  # non-finite values are refused below, by name
                array = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        except (ValueError, TypeError, NotImplementedError) as error:
            raise ImporterError(f"cannot dequantize the tensor: {error}", file=file,
                                path=f"tensors.{name}", value=kind, remedy=REMEDY) from None
        if not np.isfinite(array).all():
            raise ImporterError("the tensor holds non-finite values (NaN or infinity)",
                                file=file, path=f"tensors.{name}", value=kind, remedy=REMEDY)
        nbits = nbits_of(tensor.data, tensor.tensor_type, array) \
            if hf_name.endswith("proj.weight") else None
        heads = None if not permuted else (
            config.num_attention_heads if name.endswith(("attn_q.weight", "attn_q.bias")) else
            config.num_key_value_heads if name.endswith(("attn_k.weight", "attn_k.bias"))
            else None)
        if heads is not None:
            order = unpermute_rows(np.arange(shape[0]), heads)
            array = array[order]
            nbits = nbits.rows(order) if nbits is not None else None
        weights[hf_name] = np.ascontiguousarray(array)
        if nbits is not None:
            kept[hf_name] = nbits
        if progress is not None:
            progress(f"dequantizing {name} ({kind})", index + 1, len(tensors))
    return weights, kept


def _tokenizer(fields: _Fields, config: LlamaConfig) -> dict[str, Any]:
    """tokenizer.json and tokenizer_config.json from the ``tokenizer.ggml.*`` keys
    (``gguf_vocab``): the vocabulary kind and pre-tokenizer, scores, token types, the special
    ids, and ``add_bos_token`` / ``add_eos_token`` / ``add_space_prefix`` with llama.cpp's
    defaults where the file has none."""
    model = fields.text("tokenizer.ggml.model")
    pre = fields.text("tokenizer.ggml.pre", "default")
    tokens = fields.texts("tokenizer.ggml.tokens")
    if len(tokens) > config.vocab_size:
        raise fields.refuse("tokenizer.ggml.tokens", "the tokenizer has more tokens than the "
                            "model has rows", len(tokens), f"at most {config.vocab_size}")
    types = fields.integers("tokenizer.ggml.token_type", [1] * len(tokens))
    ids = {key: fields.integer(f"tokenizer.ggml.{key}", None) for key in (
        "bos_token_id", "unknown_token_id", "padding_token_id", "eot_token_id")}
    ids["eos_token_id"] = fields.integer("tokenizer.ggml.eos_token_id")
    for key in ("bos_token_id", "eos_token_id", "eot_token_id"):
        if ids[key] is not None and not 0 <= ids[key] < len(tokens):
            raise fields.refuse(f"tokenizer.ggml.{key}", "a special token id outside the "
                                "vocabulary", ids[key], f"0 <= id < {len(tokens)}")
    bos_id, eos_id = ids["bos_token_id"], ids["eos_token_id"]
    add_bos = fields.flag("tokenizer.ggml.add_bos_token", default_add_bos(model, pre))
    add_eos = fields.flag("tokenizer.ggml.add_eos_token", False)
    for key, wanted, token_id in (("add_bos_token", add_bos, bos_id),
                                  ("add_eos_token", add_eos, eos_id)):
        if wanted and token_id is None:
            raise fields.refuse(f"tokenizer.ggml.{key}", "the file asks for a token it does "
                                "not name", wanted, f"tokenizer.ggml.{key[4:7]}_token_id set")
    scores = fields.numbers("tokenizer.ggml.scores", None) if model == "llama" else None
    try:
        tokenizer = build_tokenizer(
            tokens, fields.texts("tokenizer.ggml.merges", []), types, model=model, pre=pre,
            scores=scores, bos_id=bos_id, eos_id=eos_id, unk_id=ids["unknown_token_id"],
            add_bos=add_bos, add_eos=add_eos,
            add_space_prefix=fields.flag("tokenizer.ggml.add_space_prefix", True))
    except ImporterError as error:  # the vocabulary's checks name no file
        raise ImporterError(problems=[replace(p, file=fields.file) for p in error.problems]) \
            from None
    bos = tokens[bos_id] if bos_id is not None else None
    extra: dict[str, Any] = {"add_bos_token": add_bos, "add_eos_token": add_eos,
                             "model_max_length": config.max_position_embeddings,
                             "clean_up_tokenization_spaces": False}
    for key, name in (("unknown_token_id", "unk_token"), ("padding_token_id", "pad_token"),
                      ("eot_token_id", "eot_token")):
        if ids[key] is not None and 0 <= ids[key] < len(tokens):
            extra[name] = tokens[ids[key]]
    return {"tokenizer_json": tokenizer.to_str(),
            "tokenizer_config": tokenizer_config(fields.text("tokenizer.chat_template", None),
                                                 bos, tokens[eos_id], extra),
            "eos_id": eos_id}
