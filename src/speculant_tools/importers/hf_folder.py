"""Read a local Hugging Face checkpoint folder into a :class:`Checkpoint`: ``config.json``,
``*.safetensors`` (one file or shards), ``tokenizer.json`` and ``tokenizer_config.json``
(copied as it is: chat template, BOS, EOS). Llama, and the families of
:mod:`~speculant_tools.importers.families` by ``model_type`` (fused weights split there)."""

from __future__ import annotations

import json
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
from speculant_tools.importers.families import BY_MODEL_TYPE, Refusal, hf_config, split_fused

ARCHITECTURES = ("LlamaForCausalLM",)


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
    """The Llama checkpoint saved in ``folder`` (float32 weights)."""
    folder = Path(folder)
    config_file = folder / "config.json"
    data = _json(config_file)
    architectures = data.get("architectures") or [data.get("model_type")]
    family = BY_MODEL_TYPE.get(data.get("model_type"))
    if family is None and architectures[0] not in ARCHITECTURES \
            and data.get("model_type") != "llama":
        raise ImporterError("this architecture is not supported", file=str(config_file),
                            path="model_type", value=data.get("model_type"),
                            expected=" or ".join(("llama", *BY_MODEL_TYPE)),
                            remedy="docs/models.md lists the families that import; a "
                                   "Gemma 3 vision checkpoint (model_type gemma3) imports "
                                   "as its text model saved alone (Gemma3ForCausalLM)")
    config = _config(data, family, config_file)
    tokenizer_json = folder / "tokenizer.json"
    if not tokenizer_json.is_file():
        raise ImporterError("the checkpoint folder lacks tokenizer.json", file=str(folder),
                            remedy="save the tokenizer with save_pretrained (a fast tokenizer)")
    eos = data.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    weights = _safetensors(folder, progress)
    if family is not None and family.is_fused:
        weights = split_fused(config, weights)
    return Checkpoint(config=config, weights=weights,
                      tokenizer_json=tokenizer_json.read_text(encoding="utf-8"),
                      tokenizer_config=read_tokenizer_config(folder),
                      eos_id=eos, source=str(folder))


def _config(data: dict[str, Any], family: Any, file: Path) -> LlamaConfig:
    """``data``'s configuration: Llama's, or its family's variations."""
    try:
        if family is None:
            return LlamaConfig.from_hf(data)
        return hf_config(family, data)
    except ExportError as error:
        raise ImporterError(f"{error}", file=str(file)) from None
    except KeyError as missing:
        raise ImporterError(f"config has no {missing.args[0]!r}", file=str(file),
                            path=f"config.{missing.args[0]}",
                            expected=f"a {family.name} config.json") from None
    except Refusal as refusal:
        raise ImporterError(f"{family.name}: {refusal.message}", file=str(file),
                            path=f"config.{refusal.path}", value=refusal.value,
                            remedy=refusal.remedy or "docs/models.md lists what imports"
                            ) from None


def _safetensors(folder: Path, progress: Progress | None) -> dict[str, np.ndarray]:
    try:
        from safetensors import safe_open
    except ModuleNotFoundError:
        raise ImporterError("reading safetensors needs the safetensors package",
                            file=str(folder), remedy="pip install 'speculant[tools]'") from None
    files = sorted(folder.glob("*.safetensors"))
    weights: dict[str, np.ndarray] = {}
    for path in files:
        with safe_open(str(path), framework="numpy") as handle:
            names = list(handle.keys())
            for index, name in enumerate(names):
                array = handle.get_tensor(name)
                if array.dtype.kind != "f":
                    raise ImporterError("only floating-point weights are supported",
                                        file=str(path), path=name, value=str(array.dtype))
                weights[name] = np.asarray(array, np.float32)
                if progress is not None:
                    progress(f"reading {path.name}: {name}", index + 1, len(names))
    return weights
