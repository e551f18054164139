"""The committed SmolLM2 drafter (made by speculant train-drafter) is what the pair writer expects:
either the v1 file (identical vocabulary, no ``draft_vocab_size``) or a subset-vocabulary one
(``draft_vocab_size`` N: its LM head is the target table's first N rows), seeded by the target's
hidden state or by EAGLE-3's fused streams (``seed_feature_layers``: the projection's weights
are among the drafter's)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from speculant_tools.export import LlamaConfig, drafter_shapes
from speculant_tools.export.config import EMBEDDING, checked_weights
from speculant_tools.importers import read_drafter

FOLDER = Path(__file__).parents[2] / "src" / "speculant_tools" / "builtin" / "smollm2"


def _config() -> tuple[dict, LlamaConfig]:
    settings = json.loads((FOLDER / "drafter_config.json").read_text())
    layers = settings.get("seed_feature_layers")
    config = LlamaConfig.from_hf(settings["target"]["config"])
    return settings, replace(config, seed_feature_layers=tuple(layers) if layers else None)


def test_npz_names_shapes_and_dtype_are_the_writers_drafter_weights():
    settings, config = _config()
    with np.load(FOLDER / "drafter.npz") as archive:
        weights = {name: archive[name] for name in archive.files}
    shapes = drafter_shapes(config)
    assert list(weights) == list(shapes)  # the shared embedding is not stored
    assert EMBEDDING not in weights
    assert {name: a.shape for name, a in weights.items()} == shapes
    assert all(a.dtype == np.float16 for a in weights.values())
    checked = checked_weights(weights, shapes, "float16", "drafter weights")  # finite, exact
    assert all(np.array_equal(checked[n], weights[n]) for n in shapes)
    assert settings["weights"] == {name: list(shape) for name, shape in shapes.items()}


def test_size_and_the_settings_the_importer_reads():
    settings, config = _config()
    assert (FOLDER / "drafter.npz").stat().st_size <= 10_000_000
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (49152, 576, 30)
    assert settings["scale"] == math.sqrt(config.hidden_size) == 24.0
    assert settings["drafter_intermediate_size"] == config.intermediate_size
    assert settings["max_proposal_width"] == 8
    vocab = settings.get("draft_vocab_size")  # absent: the v1 file, identical vocabulary
    assert vocab is None or (type(vocab) is int and 1 <= vocab < config.vocab_size)
    drafter = read_drafter(FOLDER, config)
    assert drafter is not None and drafter.vocab_size == vocab
