"""onnxruntime-genai model folders: ``genai_config.json`` + the builder's ``model.onnx``.

The graph is copied as it is (with its external data) and described by a greedy-decoder
document (docs/design/spec/metadata.md §8.1) whose ports are the graph's own IO, as
``genai_config.json`` names them::

    input_ids [batch, sequence]   attention_mask [batch, total_sequence]
    (position_ids [batch, sequence], where the graph has it)
    past_key_values.{i}.key|value [batch, kv_heads, past_sequence, head_size]
    logits [batch, sequence, vocab]
    present.{i}.key|value [batch, kv_heads, total_sequence, head_size]

The builder's GroupQueryAttention takes its positions from the attention mask, so a graph
without ``position_ids`` is declared without it. speculant passes past and present as
separate tensors (the append update of its state groups), not genai's shared buffer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import onnx

from speculant_tools.export import LlamaConfig
from speculant_tools.export.metadata import decoder_metadata
from speculant_tools.export.package import tokenizer_facts
from speculant_tools.importers.checkpoint import (
    TOKENIZER_CONFIG,
    ImporterError,
    check_chat_template,
    read_tokenizer_config,
)
from speculant_tools.writing import write_metadata

GENAI_CONFIG = "genai_config.json"
EXPECTED_INPUTS = {"input_ids": "input_ids", "attention_mask": "attention_mask",
                   "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                   "past_value_names": "past_key_values.%d.value"}
EXPECTED_OUTPUTS = {"logits": "logits", "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value"}
ELEMENT_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16"}


def is_genai_folder(path: Path) -> bool:
    return (path / GENAI_CONFIG).is_file()


def _need(data: dict[str, Any], key: str, file: str) -> Any:
    value: Any = data
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ImporterError("genai_config.json lacks a required key", file=file, path=key)
        value = value[part]
    return value


def _check_names(declared: dict[str, Any], expected: dict[str, str], where: str,
                 file: str) -> None:
    for key, name in declared.items():
        if key not in expected:
            raise ImporterError("this graph input or output has no role in speculant",
                                file=file, path=f"{where}.{key}", value=name,
                                expected=", ".join(expected))
        if name != expected[key]:
            raise ImporterError("renamed graph IO is not supported", file=file,
                                path=f"{where}.{key}", value=name, expected=expected[key])


def import_genai_folder(folder: str | Path, out: str | Path, *, dtype: str = "float32") -> Path:
    """Write the package of the onnxruntime-genai model in ``folder`` into ``out``."""
    folder, out = Path(folder), Path(out)
    file = str(folder / GENAI_CONFIG)
    try:
        data = json.loads((folder / GENAI_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ImporterError(f"cannot read the JSON: {error}", file=file) from None
    decoder = _need(data, "model.decoder", file)
    inputs, outputs = _need(data, "model.decoder.inputs", file), \
        _need(data, "model.decoder.outputs", file)
    _check_names(inputs, EXPECTED_INPUTS, "model.decoder.inputs", file)
    _check_names(outputs, EXPECTED_OUTPUTS, "model.decoder.outputs", file)
    graph_file = folder / _need(data, "model.decoder.filename", file)
    model = _read_graph(graph_file)
    graph_inputs = {v.name: v for v in model.graph.input}
    logits = next((v for v in model.graph.output if v.name == "logits"), None)
    if logits is None:
        raise ImporterError("the graph has no logits output", file=str(graph_file),
                            path="graph.output.logits")
    graph_dtype = ELEMENT_DTYPES.get(logits.type.tensor_type.elem_type)
    if graph_dtype != dtype:
        raise ImporterError("the graph is not in this dtype (the import copies the graph, "
                            "it does not convert it)", file=str(graph_file), path="dtype",
                            value=dtype, expected=str(graph_dtype),
                            remedy=f"import with --dtype {graph_dtype}")
    config = LlamaConfig(
        vocab_size=_need(data, "model.vocab_size", file),
        hidden_size=_need(decoder, "hidden_size", file),
        num_hidden_layers=_need(decoder, "num_hidden_layers", file),
        num_attention_heads=_need(decoder, "num_attention_heads", file),
        num_key_value_heads=_need(decoder, "num_key_value_heads", file),
        intermediate_size=1,  # not declared by the document
        max_position_embeddings=_need(data, "model.context_length", file),
        head_dim=_need(decoder, "head_size", file))
    tokenizer = folder / "tokenizer.json"
    if not tokenizer.is_file():
        raise ImporterError("the folder lacks tokenizer.json", file=str(folder))
    eos = _need(data, "model.eos_token_id", file)
    eos_id = eos[0] if isinstance(eos, list) else eos
    document = decoder_metadata(config, dtype, tokenizer_facts(tokenizer, eos_id))
    if "position_ids" not in graph_inputs:
        _drop_position_ids(document)
    tokenizer_config = read_tokenizer_config(folder)
    check_chat_template(tokenizer_config, str(folder))
    out.mkdir(parents=True, exist_ok=True)
    _copy_graph(model, graph_file, out / "decoder")
    write_metadata(document, out, f"onnxruntime-genai model imported from {folder}: the "
                   "builder's graph, copied.")
    shutil.copyfile(tokenizer, out / "tokenizer.json")
    (out / TOKENIZER_CONFIG).write_text(json.dumps(tokenizer_config, indent=2,
                                                   ensure_ascii=False) + "\n")
    return out


def _read_graph(path: Path) -> onnx.ModelProto:
    try:
        return onnx.load(str(path), load_external_data=False)
    except (OSError, Exception) as error:  # noqa: BLE001 (protobuf's DecodeError)
        raise ImporterError(f"cannot read the graph: {error}", file=str(path)) from None


def _copy_graph(model: onnx.ModelProto, graph_file: Path, destination: Path) -> None:
    """model.onnx and the external data files its initializers name, side by side."""
    destination.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(graph_file, destination / "model.onnx")
    locations = {entry.value for tensor in model.graph.initializer
                 for entry in tensor.external_data if entry.key == "location"}
    for location in sorted(locations):
        if Path(location).is_absolute() or ".." in Path(location).parts:
            raise ImporterError("external data outside the model folder", file=str(graph_file),
                                value=location)
        shutil.copyfile(graph_file.parent / location, destination / location)


def _drop_position_ids(document: dict[str, Any]) -> None:
    workflow = document["pipeline"]["workflow"]
    del workflow["inputs"]["request.position_ids"]
    ports = workflow["components"]["decoder"]["ports"]
    del ports["inputs"]["position_ids"], ports["roles"]["position_ids"]
    del workflow["steps"][0]["inputs"]["position_ids"]
