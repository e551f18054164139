"""What every importer produces, and the one writer that turns it into a package.

    checkpoint = read_gguf("model.gguf")              # or read_hf_folder("folder")
    write_checkpoint(checkpoint, "out", dtype="float32")

A :class:`Checkpoint` is a Llama target in Hugging Face names (``speculant_tools.export``
lists them) with its tokenizer: the ``tokenizer.json`` text and the ``tokenizer_config.json``
mapping (``chat_template``, ``bos_token``, ``eos_token``, as Hugging Face writes them), which
the engine's chat reads beside ``tokenizer.json``.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from speculant.errors import MetadataError, SpeculantError
from speculant.text.chat import chat_template_of
from speculant_tools.export import LlamaConfig, write_decoder_package, write_pair_package

TOKENIZER_CONFIG = "tokenizer_config.json"
QUANTIZATIONS = (None, "int4", "float")
MIN_POSITIONS = 1 << 15  # a context of up to this many positions is always accepted

# progress(description, completed, total): the importers report each tensor they read
Progress = Callable[[str, int, int], None]


class ImporterError(SpeculantError):
    """A source cannot be imported: unreadable, or outside the supported architecture."""


def max_positions(config: LlamaConfig, num_weight_values: int) -> int:
    """The longest context a source holding ``num_weight_values`` weight values may declare
    (every importer's bound, checked before anything is allocated). The export bakes RoPE
    tables of ``context x head_dim`` float32 values (and a slot index per position) into each
    graph: they may be no larger than the weights, or :data:`MIN_POSITIONS` positions,
    whichever allows more. A real model's tables are a small fraction of its weights
    (SmolLM2-135M: 0.4 %, Llama 3.1 8B: 0.2 %); 2^25 positions beside 14 KB of weights would
    be 2 GB."""
    return max(MIN_POSITIONS, num_weight_values // config.head_dim)


@dataclass
class Drafter:
    """A trained chained drafter for the checkpoint (``drafter_shapes`` names)."""

    weights: dict[str, np.ndarray]
    scale: float | None = None  # None: sqrt(hidden_size)
    max_proposal_width: int = 8
    intermediate_size: int | None = None  # None: the target's
    vocab_size: int | None = None  # None: the target's; N: its LM head is the table's first N
    # None: seeded by the target's final hidden state; layers: EAGLE-3's fused seed, whose
    # projection (``drafter.seed_fusion.*`` in ``weights``) goes into the target's graph
    seed_feature_layers: tuple[int, ...] | None = None


@dataclass
class Checkpoint:
    """A Llama target ready to be written as a package."""

    config: LlamaConfig
    weights: dict[str, np.ndarray]  # HF name -> array (float32)
    tokenizer_json: str  # the text of tokenizer.json
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    eos_id: int | None = None  # None: the tokenizer's one EOS-named special token
    source: str = ""  # for messages
    # HF name -> the source's quantized blocks, kept as MatMulNBits in a float32 package
    # (importers.gguf_quant); ``weights`` holds the same values dequantized
    kept: dict[str, Any] = field(default_factory=dict)


def write_checkpoint(checkpoint: Checkpoint, out: str | Path, *, dtype: str = "float32",
                     graph: str = "auto", quantize: str | None = None,
                     drafter: Drafter | None = None, cache: str = "appended",
                     external_data: bool | None = None, batch: int | None = None) -> Path:
    """Write ``checkpoint`` as a package in ``out``: a chained pair with ``drafter``, a
    greedy decoder without; ``tokenizer.json`` and ``tokenizer_config.json`` beside.
    The linear layers in ``checkpoint.kept`` stay quantized in a float32 package (MatMulNBits
    with exactly the dequantized weights; ``quantize="float"`` widens them too);
    ``quantize="int4"``: the target's other linear layers as MatMulNBits (``importers.int4``);
    ``cache``: the caches' form, ``appended`` or ``static`` (docs/design/static-cache.md);
    ``external_data``: the weights beside each graph (``export.package.write_graph``);
    ``batch`` (static only): the batched pass of up to ``batch`` rows beside the target
    (docs/design/batching.md), its linear layers kept and quantized as the target's."""
    check_quantize(quantize, dtype)
    check_chat_template(checkpoint.tokenizer_config, checkpoint.source)
    out = Path(out)
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = Path(scratch) / "tokenizer.json"
        tokenizer.write_text(checkpoint.tokenizer_json, encoding="utf-8")
        if drafter is None:
            write_decoder_package(out, checkpoint.weights, checkpoint.config, tokenizer,
                                  dtype=dtype, eos_id=checkpoint.eos_id, graph=graph,
                                  cache=cache, external_data=external_data, batch=batch)
        else:
            config = replace(checkpoint.config,
                             drafter_intermediate_size=drafter.intermediate_size,
                             draft_vocab_size=drafter.vocab_size,
                             seed_feature_layers=drafter.seed_feature_layers)
            write_pair_package(out, checkpoint.weights, config, drafter.weights, tokenizer,
                               dtype=dtype, scale=drafter.scale,
                               max_proposal_width=drafter.max_proposal_width,
                               eos_id=checkpoint.eos_id, graph=graph, cache=cache,
                               external_data=external_data, batch=batch)
    folder = out / ("decoder" if drafter is None else "target")
    graph_paths = [folder / "model.onnx", *([folder / "batched.onnx"] if batch else [])]
    for graph_path in graph_paths:  # the batched pass computes with the target's weights
        if checkpoint.kept and dtype == "float32" and quantize != "float":
            from speculant_tools.importers.int4 import keep_nbits

            keep_nbits(graph_path, checkpoint.kept)
        if quantize == "int4":
            from speculant_tools.importers.int4 import quantize_int4

            quantize_int4(graph_path)
    (out / TOKENIZER_CONFIG).write_text(
        json.dumps(checkpoint.tokenizer_config, indent=2, ensure_ascii=False) + "\n",
        encoding="utf-8")
    return out


def check_quantize(quantize: str | None, dtype: str = "float32") -> None:
    if quantize not in QUANTIZATIONS:
        raise ImporterError("unknown quantization", path="quantize", value=quantize,
                            expected="int4, float, or none")
    if quantize == "int4" and dtype != "float32":
        raise ImporterError("int4 (MatMulNBits) is written for float32 packages",
                            path="quantize", value=(quantize, dtype),
                            remedy="import with --dtype float32 --quantize int4")


def read_drafter(folder: Path, config: LlamaConfig) -> Drafter | None:
    """The drafter in ``folder`` (``drafter.npz`` + ``drafter_config.json``), or None where
    neither file exists. ``drafter_config.json`` keys read: ``scale``,
    ``max_proposal_width``, ``drafter_intermediate_size``, ``draft_vocab_size`` (absent: the
    target's whole vocabulary; N: a subset, the first N ids), ``seed_feature_layers``
    (absent: the seed is the target's final hidden state; a list: EAGLE-3's fused seed over
    those residual streams, its projection among the weights) (others are the trainer's
    notes)."""
    weights_file, config_file = folder / "drafter.npz", folder / "drafter_config.json"
    if not weights_file.exists() and not config_file.exists():
        return None
    for path in (weights_file, config_file):
        if not path.exists():
            raise ImporterError("a drafter needs both drafter.npz and drafter_config.json",
                                file=str(path), remedy="commit both files, or neither")
    try:
        settings = json.loads(config_file.read_text())
        with np.load(weights_file) as archive:
            weights = {name: archive[name] for name in archive.files}
    except (OSError, ValueError) as error:
        raise ImporterError(f"cannot read the drafter: {error}", file=str(folder)) from None
    scale = settings.get("scale")
    if scale is not None and not (isinstance(scale, int | float) and math.isfinite(scale)):
        raise ImporterError("scale must be a finite number", file=str(config_file),
                            path="scale", value=scale)
    vocab_size = settings.get("draft_vocab_size")
    if vocab_size is not None and not (isinstance(vocab_size, int) and not isinstance(
            vocab_size, bool) and 1 <= vocab_size <= config.vocab_size):
        raise ImporterError("draft_vocab_size must be an integer in [1, the target's "
                            "vocabulary]", file=str(config_file), path="draft_vocab_size",
                            value=vocab_size, expected=f"1 <= N <= {config.vocab_size}",
                            remedy="write the number of leading target ids the drafter "
                                   "scores, or leave the key out for all of them")
    layers = settings.get("seed_feature_layers")
    if layers is not None and not (isinstance(layers, list) and layers and all(
            isinstance(i, int) and not isinstance(i, bool)
            and 0 <= i <= config.num_hidden_layers for i in layers)):
        raise ImporterError("seed_feature_layers must be a list of layer indices",
                            file=str(config_file), path="seed_feature_layers", value=layers,
                            expected=f"integers in [0, {config.num_hidden_layers}]",
                            remedy="write the residual streams the seed fuses (the trainer's "
                                   "drafter_config.json), or leave the key out")
    return Drafter(weights=weights, scale=scale,
                   max_proposal_width=int(settings.get("max_proposal_width", 8)),
                   intermediate_size=settings.get("drafter_intermediate_size")
                   or config.intermediate_size, vocab_size=vocab_size,
                   seed_feature_layers=tuple(layers) if layers is not None else None)


def tokenizer_config(chat_template: str | None, bos: str | None, eos: str | None,
                     extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``tokenizer_config.json`` as Hugging Face writes it (the keys the chat reads)."""
    data: dict[str, Any] = dict(extra or {})
    data.update({"bos_token": bos, "eos_token": eos})
    if chat_template is not None:
        data["chat_template"] = chat_template
    return data


def check_chat_template(config: Mapping[str, Any], source: str) -> None:
    """Refuse, before anything is written, a chat template the engine would refuse at load:
    one that does not compile or cannot render a one-message conversation within its
    bounds (the engine's own check, :func:`speculant.text.chat.chat_template_of`)."""
    try:
        chat_template_of(dict(config), source)
    except MetadataError as error:
        problem = error.problems[0]
        raise ImporterError(problem.message, file=source, path="chat_template",
                            remedy="fix the template where it comes from (a GGUF file's "
                                   "tokenizer.chat_template; a folder's tokenizer_config.json "
                                   "or chat_template.jinja), then import again") from None


def read_tokenizer_config(folder: Path) -> dict[str, Any]:
    """``folder/tokenizer_config.json`` (empty where absent) with the chat template folded
    in from ``chat_template.jinja``, where transformers 5 writes it."""
    path = folder / TOKENIZER_CONFIG
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError) as error:
        raise ImporterError(f"cannot read the JSON: {error}", file=str(path)) from None
    if not isinstance(data, dict):
        raise ImporterError("expected a JSON object", file=str(path), value=type(data).__name__)
    template = folder / "chat_template.jinja"
    if "chat_template" not in data and template.is_file():
        data["chat_template"] = template.read_text(encoding="utf-8")
    return data
