"""A tiny GGUF of a 2-layer Llama and its import, written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_models import random_weights, stored_weights, write_gguf

from speculant_tools.importers import import_model


@pytest.fixture(scope="session")
def weights() -> dict:
    return random_weights()


@pytest.fixture(scope="session")
def stored(weights) -> dict:
    return stored_weights(weights)


@pytest.fixture(scope="session")
def gguf_path(tmp_path_factory, weights) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", weights)


@pytest.fixture(scope="session")
def imported(tmp_path_factory, gguf_path) -> Path:
    return import_model(gguf_path, tmp_path_factory.mktemp("imported") / "package")


@pytest.fixture(scope="session")
def imported_appended(tmp_path_factory, gguf_path) -> Path:
    """The same import with appended caches: the IO form of onnxruntime-genai's builder."""
    return import_model(gguf_path, tmp_path_factory.mktemp("appended") / "package",
                        cache="appended")
