"""Hostile Hugging Face folders (issue 38): a ``config.json`` whose sizes the safetensors
files do not back ends in an ImporterError naming config.json, the field, the value and the
remedy, before any tensor is read; memory stays bounded by the tensors present
(max_position_embeddings 2^25 or num_hidden_layers 10^6 beside ~100 KB of weights allocate
nothing in proportion)."""

from __future__ import annotations

import json
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="HF folders are read with safetensors")

from family_models import HF_CONFIGS, write_hf_folder  # noqa: E402

from speculant_tools.importers import ImporterError, import_model, read_checkpoint  # noqa: E402
from speculant_tools.importers.checkpoint import MIN_POSITIONS  # noqa: E402

PEAK_BYTES = 32 << 20  # traced peak of refusing any crafted folder (the weights: ~0.1 MB)
WEIGHTS = "model.safetensors"


def _config(family: str, **change) -> dict:
    return {**HF_CONFIGS[family], **change}


def _safetensors_header(folder: Path) -> tuple[dict, bytes]:
    data = (folder / WEIGHTS).read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + size]), data[8 + size:]


def _rewrite(folder: Path, header: dict, body: bytes) -> None:
    text = json.dumps(header).encode()
    (folder / WEIGHTS).write_bytes(struct.pack("<Q", len(text)) + text + body)


def _int_embedding(folder: Path) -> None:
    header, body = _safetensors_header(folder)
    header["model.embed_tokens.weight"]["dtype"] = "I32"
    _rewrite(folder, header, body)


def _truncated(folder: Path) -> None:
    path = folder / WEIGHTS
    path.write_bytes(path.read_bytes()[:-100])


def _huge_header(folder: Path) -> None:
    data = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(struct.pack("<Q", 1 << 60) + data[8:])


# name: (family, config.json changes, a change to the weights file, the field named,
#        the file named: config.json or the weights)
CRAFTED = {
    "max_position_embeddings 2^25": ("gemma2", {"max_position_embeddings": 1 << 25}, None,
                                     "max_position_embeddings", "config.json"),
    "max_position_embeddings 2^40": ("phi3", {"max_position_embeddings": 1 << 40}, None,
                                     "max_position_embeddings", "config.json"),
    "num_hidden_layers 10^6, 2 present": ("gemma2", {"num_hidden_layers": 10**6}, None,
                                          "num_hidden_layers", "config.json"),
    "num_hidden_layers 1, 2 present": ("phi3", {"num_hidden_layers": 1}, None,
                                       "num_hidden_layers", "config.json"),
    "vocab_size 2^30": ("gemma2", {"vocab_size": 1 << 30}, None, "vocab_size", "config.json"),
    "hidden_size 2^20": ("gemma2", {"hidden_size": 1 << 20}, None, "hidden_size",
                         "config.json"),
    "intermediate_size 2^30": ("gemma2", {"intermediate_size": 1 << 30}, None,
                               "model.layers.0.mlp.down_proj.weight", "config.json"),
    "fused intermediate_size 65": ("phi3", {"intermediate_size": 65}, None,
                                   "model.layers.0.mlp.down_proj.weight", "config.json"),
    "fused num_key_value_heads 2 (1 held)": ("phi3", {"num_key_value_heads": 2}, None,
                                             "model.layers.0.self_attn.qkv_proj.weight",
                                             "config.json"),
    "num_key_value_heads 4 (2 held)": ("gemma2", {"num_key_value_heads": 4}, None,
                                       "model.layers.0.self_attn.k_proj.weight",
                                       "config.json"),
    "an integer tensor": ("gemma2", {}, _int_embedding, "model.embed_tokens.weight",
                          WEIGHTS),
    "a truncated weights file": ("gemma2", {}, _truncated, None, WEIGHTS),
    "a header size of 2^60": ("gemma2", {}, _huge_header, None, WEIGHTS),
}


@pytest.mark.parametrize("case", CRAFTED)
def test_a_crafted_folder_is_a_typed_error_in_bounded_memory(case, tmp_path):
    family, change, edit, field, named_file = CRAFTED[case]
    folder = write_hf_folder(tmp_path / "hf", family, _config(family, **change))
    if edit is not None:
        edit(folder)
    tracemalloc.start()
    try:
        with pytest.raises(ImporterError) as caught:
            import_model(folder, tmp_path / "out")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    problem = caught.value.problems[0]
    assert problem.file == str(folder / named_file), str(caught.value)
    if field is not None:
        assert caught.value.paths == [field], str(caught.value)
    if named_file == "config.json":
        assert problem.value is not None and "config.json" in problem.remedy + problem.message
    assert peak < PEAK_BYTES, f"{peak / 2**20:.0f} MiB traced"
    assert not (tmp_path / "out").exists()


def test_max_position_embeddings_is_bounded_by_the_weights(tmp_path):
    """Up to MIN_POSITIONS positions always; beyond, no more than the weights' values per
    head dimension (the tiny model holds ~40 k values: 2.5 k positions) — GGUF's bound."""
    def folder(n: int) -> Path:
        return write_hf_folder(tmp_path / str(n), "gemma2",
                               _config("gemma2", max_position_embeddings=n))
    assert read_checkpoint(folder(MIN_POSITIONS)).config.max_position_embeddings == \
        MIN_POSITIONS
    with pytest.raises(ImporterError, match="max_position_embeddings in config.json") as caught:
        read_checkpoint(folder(MIN_POSITIONS + 1))
    assert caught.value.paths == ["max_position_embeddings"]


def test_a_tied_checkpoint_may_carry_its_lm_head(tmp_path):
    """Some checkpoints save the tied head beside the embedding: its shape is the
    embedding's, and the folder still reads."""
    from safetensors.numpy import load_file, save_file

    folder = write_hf_folder(tmp_path / "hf", "gemma2")
    weights = load_file(str(folder / WEIGHTS))
    weights["lm_head.weight"] = np.array(weights["model.embed_tokens.weight"])
    save_file(weights, str(folder / WEIGHTS))
    assert "lm_head.weight" in read_checkpoint(folder).weights
