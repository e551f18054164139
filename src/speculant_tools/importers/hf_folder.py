"""Read a local Hugging Face checkpoint folder into a :class:`Checkpoint`: ``config.json``,
``*.safetensors`` (one file or shards; float32, float16 or bfloat16), ``tokenizer.json`` and
``tokenizer_config.json`` (copied as it is: chat template, BOS, EOS). The families of
:mod:`~speculant_tools.importers.families` by ``model_type`` (fused weights split there).
Old checkpoints' saved rotary buffers (``rotary_emb.inv_freq``) are skipped: the graph
computes RoPE itself. A Gemma 3 multimodal folder (``Gemma3ForConditionalGeneration``) is
read as its text model: ``text_config`` over :data:`GEMMA3_TEXT_DEFAULTS`, the weights under
``language_model.`` renamed, the vision tower and projector not read."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from speculant_tools.export import ExportError, LlamaConfig
from speculant_tools.importers.checkpoint import (
    Checkpoint,
    ImporterError,
    Progress,
    read_tokenizer_config,
)
from speculant_tools.importers.families import (
    BY_MODEL_TYPE,
    Family,
    Refusal,
    hf_config,
    hf_family,
    split_fused,
)

FLOAT_TYPES = ("F32", "F16", "BF16")  # safetensors' names
SKIPPED_SUFFIX = "rotary_emb.inv_freq"  # a buffer older transformers saved with the weights


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
    weights = _safetensors(folder, progress, prefixes)
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


def _safetensors(folder: Path, progress: Progress | None,
                 prefixes: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """The float32 weights of every file, renamed by :func:`_renamed` (None: not read)."""
    try:
        from safetensors import safe_open
    except ModuleNotFoundError:
        raise ImporterError("reading safetensors needs the safetensors package",
                            file=str(folder), remedy="pip install 'speculant[tools]'") from None
    files = sorted(folder.glob("*.safetensors"))
    weights: dict[str, np.ndarray] = {}
    for path in files:
        with safe_open(str(path), framework="numpy") as handle:
            names = [name for name in handle.keys() if not name.endswith(SKIPPED_SUFFIX)
                     and _renamed(name, prefixes) is not None]
            for index, name in enumerate(names):
                kind = handle.get_slice(name).get_dtype()
                if kind not in FLOAT_TYPES:
                    raise ImporterError("only floating-point weights are supported",
                                        file=str(path), path=name, value=kind,
                                        expected=", ".join(FLOAT_TYPES))
                weights[_renamed(name, prefixes)] = (_bfloat16(path, name) if kind == "BF16"
                                 else np.asarray(handle.get_tensor(name), np.float32))
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
