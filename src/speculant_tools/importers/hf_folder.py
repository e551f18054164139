"""Read a local Hugging Face checkpoint folder into a :class:`Checkpoint`: ``config.json``,
``*.safetensors`` (one file or shards; float32, float16 or bfloat16), ``tokenizer.json`` and
``tokenizer_config.json`` (copied as it is: chat template, BOS, EOS). The families of
:mod:`~speculant_tools.importers.families` by ``model_type`` (fused weights split there).
Old checkpoints' saved rotary buffers (``rotary_emb.inv_freq``) are skipped: the graph
computes RoPE itself. A Gemma 3 multimodal folder (``Gemma3ForConditionalGeneration``) is
read as its text model: ``text_config`` over :data:`GEMMA3_TEXT_DEFAULTS`, the weights under
``language_model.`` renamed, the vision tower and projector not read. ``config.json``'s sizes
are checked against the tensors the safetensors headers declare before any tensor is read
(:func:`_check_sizes`), so memory stays bounded by the weights present whatever the sizes
claim."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from speculant_tools.export import ExportError, LlamaConfig, target_shapes
from speculant_tools.export.config import EMBEDDING, LM_HEAD
from speculant_tools.importers.checkpoint import (
    Checkpoint,
    ImporterError,
    Progress,
    max_positions,
    read_tokenizer_config,
)
from speculant_tools.importers.families import (
    BY_MODEL_TYPE,
    Family,
    Refusal,
    fused_shapes,
    hf_config,
    hf_family,
    split_fused,
)

FLOAT_TYPES = ("F32", "F16", "BF16")  # safetensors' names
SKIPPED_SUFFIX = "rotary_emb.inv_freq"  # a buffer older transformers saved with the weights
SIZES_REMEDY = ("use the config.json saved with these weights (save_pretrained writes both), "
                "or correct the field to the checkpoint's size")


@dataclass(frozen=True)
class Header:
    """One tensor as its safetensors file's header declares it (nothing read yet)."""

    file: Path
    dtype: str  # safetensors' name: F32, BF16, ...
    shape: tuple[int, ...]
    stored: str  # the name in the file (a multimodal checkpoint's prefixed name)


# Gemma3TextConfig's defaults, which a multimodal config.json's text_config omits
GEMMA3_TEXT_DEFAULTS = {
    "model_type": "gemma3_text", "vocab_size": 262_208, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6,
    "tie_word_embeddings": True}
# a multimodal checkpoint's text weights (transformers 4.49-4.51, 4.52 on) -> the text model's
TEXT_PREFIXES = {"language_model.model.": "model.", "language_model.lm_head.": "lm_head.",
                 "model.language_model.": "model.", "lm_head.": "lm_head."}


def text_model(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str] | None]:
    """``data`` and no renaming, or, for a Gemma 3 multimodal ``config.json``, its text
    model's configuration and :data:`TEXT_PREFIXES` (other weights are not read)."""
    text = data.get("text_config")
    if data.get("model_type") != "gemma3" or not isinstance(text, dict):
        return data, None
    return {**GEMMA3_TEXT_DEFAULTS, **text, "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text", "eos_token_id": data.get(
                "eos_token_id", text.get("eos_token_id"))}, TEXT_PREFIXES


def _renamed(name: str, prefixes: dict[str, str] | None) -> str | None:
    if prefixes is None:
        return name
    prefix = next((p for p in prefixes if name.startswith(p)), None)
    return None if prefix is None else prefixes[prefix] + name.removeprefix(prefix)


def is_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ImporterError("the checkpoint folder lacks this file", file=str(path),
                            remedy="save the model and its tokenizer with save_pretrained")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ImporterError(f"cannot read the JSON: {error}", file=str(path)) from None
    if not isinstance(data, dict):
        raise ImporterError("expected a JSON object", file=str(path), value=type(data).__name__)
    return data


def read_hf_folder(folder: str | Path, progress: Progress | None = None) -> Checkpoint:
    """The checkpoint saved in ``folder`` (float32 weights)."""
    folder = Path(folder)
    config_file = folder / "config.json"
    data, prefixes = text_model(_json(config_file))
    family = hf_family(data)
    if family is None:
        raise ImporterError("this architecture is not supported", file=str(config_file),
                            path="model_type", value=data.get("model_type"),
                            expected=" or ".join(BY_MODEL_TYPE),
                            remedy="docs/models.md lists the families that import")
    config = _config(data, family, config_file)
    tokenizer_json = folder / "tokenizer.json"
    if not tokenizer_json.is_file():
        raise ImporterError("the checkpoint folder lacks tokenizer.json", file=str(folder),
                            remedy="save the tokenizer with save_pretrained (a fast tokenizer)")
    eos = data.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    headers = _headers(folder, prefixes)
    _check_sizes(config, family, headers, config_file)
    weights = _safetensors(headers, progress)
    if family.is_fused:
        weights = split_fused(config, weights)
    return Checkpoint(config=config, weights=weights,
                      tokenizer_json=tokenizer_json.read_text(encoding="utf-8"),
                      tokenizer_config=read_tokenizer_config(folder),
                      eos_id=eos, source=str(folder))


def _config(data: dict[str, Any], family: Family, file: Path) -> LlamaConfig:
    """``data``'s configuration: its family's variations."""
    try:
        return LlamaConfig(**hf_config(family, data))
    except ExportError as error:  # names the field; the file is this one
        raise ImporterError(problems=[replace(p, file=str(file)) for p in error.problems]) \
            from None
    except KeyError as missing:
        raise ImporterError(f"config has no {missing.args[0]!r}", file=str(file),
                            path=f"config.{missing.args[0]}",
                            expected=f"a {family.name} config.json") from None
    except Refusal as refusal:
        raise ImporterError(f"{family.name}: {refusal.message}", file=str(file),
                            path=f"config.{refusal.path}", value=refusal.value,
                            expected=refusal.expected,
                            remedy=refusal.remedy or "docs/models.md lists what imports"
                            ) from None


def _headers(folder: Path, prefixes: dict[str, str] | None = None) -> dict[str, Header]:
    """Every weight the folder's safetensors files declare, from their headers alone (the
    safetensors reader refuses a header whose offsets the file's bytes do not back), under
    its text-model name (:func:`_renamed`; a weight it does not rename is not read)."""
    try:
        from safetensors import SafetensorError, safe_open
    except ModuleNotFoundError:
        raise ImporterError("reading safetensors needs the safetensors package",
                            file=str(folder), remedy="pip install 'speculant[tools]'") from None
    headers: dict[str, Header] = {}
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="numpy") as handle:
                for stored in handle.keys():
                    name = _renamed(stored, prefixes)
                    if name is not None and not stored.endswith(SKIPPED_SUFFIX):
                        part = handle.get_slice(stored)
                        headers[name] = Header(path, part.get_dtype(), tuple(part.get_shape()),
                                               stored)
        except (SafetensorError, OSError) as error:
            raise ImporterError(f"the safetensors reader refuses the file: {error}",
                                file=str(path), remedy="save the weights again with "
                                "save_pretrained (or safetensors' save_file)") from None
    for name, header in headers.items():
        if header.dtype not in FLOAT_TYPES:
            raise ImporterError("only floating-point weights are supported",
                                file=str(header.file), path=name, value=header.dtype,
                                expected=", ".join(FLOAT_TYPES))
    return headers


def _check_sizes(config: LlamaConfig, family: Family, headers: dict[str, Header],
                 file: Path) -> None:
    """``config.json``'s sizes against the tensors present, before a tensor is read:
    ``num_hidden_layers`` is the number of layers whose tensors the files hold (checked
    first: the expected shapes are a list as long as the declared layers), ``vocab_size`` and
    ``hidden_size`` the embedding's shape, every known weight the shape the sizes give, and
    ``max_position_embeddings`` within :func:`max_positions` of the weights' values."""
    def refuse(field: str, message: str, value: object, expected: str) -> ImporterError:
        return ImporterError(message, file=str(file), path=field, value=value,
                             expected=expected, remedy=SIZES_REMEDY)

    layers = {name.split(".")[2] for name in headers if name.startswith("model.layers.")}
    if config.num_hidden_layers != len(layers):
        raise refuse("num_hidden_layers", "the safetensors files hold the tensors of another "
                     "number of layers", config.num_hidden_layers,
                     f"{len(layers)} (the layers whose tensors the files hold)")
    embedding = headers.get(EMBEDDING)
    if embedding is not None and len(embedding.shape) == 2:
        for field, size, held in (("vocab_size", config.vocab_size, embedding.shape[0]),
                                  ("hidden_size", config.hidden_size, embedding.shape[1])):
            if size != held:
                raise refuse(field, f"{EMBEDDING} in {embedding.file.name} has another "
                             f"{field} ([vocab_size, hidden_size] = {list(embedding.shape)})",
                             size, str(held))
    shapes = target_shapes(config)
    if family.is_fused:  # q/k/v and gate/up as the checkpoint holds them
        shapes = fused_shapes(config, shapes)
    shapes.setdefault(LM_HEAD, shapes[EMBEDDING])  # tied: an unequal one is refused at export
    for name, header in sorted(headers.items()):
        if name in shapes and header.shape != shapes[name]:
            raise refuse(name, f"the tensor in {header.file.name} disagrees with the sizes "
                         "config.json declares (hidden_size, intermediate_size, "
                         "num_attention_heads, num_key_value_heads, head_dim)",
                         list(header.shape), f"{list(shapes[name])}")
    num_values = sum(math.prod(header.shape) for header in headers.values())
    limit = max_positions(config, num_values)
    if config.max_position_embeddings > limit:
        raise ImporterError("the context is out of proportion to the weights the "
                            "safetensors files hold (the export builds position tables of "
                            "max_position_embeddings x head_dim values)", file=str(file),
                            path="max_position_embeddings",
                            value=config.max_position_embeddings, expected=f"at most {limit}",
                            remedy="set max_position_embeddings in config.json to the model's "
                                   "real context length")


def _safetensors(headers: dict[str, Header], progress: Progress | None
                 ) -> dict[str, np.ndarray]:
    """The tensors of ``headers`` as float32 arrays."""
    from safetensors import safe_open

    weights: dict[str, np.ndarray] = {}
    for path in sorted({header.file for header in headers.values()}):
        names = [name for name, header in headers.items() if header.file == path]
        with safe_open(str(path), framework="numpy") as handle:
            for index, name in enumerate(names):
                stored = headers[name].stored
                weights[name] = (_bfloat16(path, stored) if headers[name].dtype == "BF16"
                                 else np.asarray(handle.get_tensor(stored), np.float32))
                if progress is not None:
                    progress(f"reading {path.name}: {name}", index + 1, len(names))
    return weights


def _bfloat16(path: Path, name: str) -> np.ndarray:
    """A BF16 tensor as float32 (exact: bfloat16 is float32's upper half), read by the
    safetensors layout (an 8-byte little-endian header size, the JSON header, the data),
    since numpy has no bfloat16 for safetensors' numpy reader to build."""
    with path.open("rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        info = json.loads(handle.read(size))[name]
        start, end = info["data_offsets"]
        handle.seek(8 + size + start)
        raw = np.frombuffer(handle.read(end - start), np.dtype("<u2"))
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])
