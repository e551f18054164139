"""Tiny random Llama pairs written by speculant_tools.export, once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from export_models import (
    CONFIG,
    DRAFT_CONFIG,
    DRAFT_WEIGHTS,
    DRAFTER_WEIGHTS,
    TARGET_WEIGHTS,
    write_tokenizer,
)

from speculant_tools.export import convert, write_decoder_package, write_pair_package


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")


@pytest.fixture(scope="session")
def pair_root(tmp_path_factory, tokenizer_path) -> Path:
    root = tmp_path_factory.mktemp("export") / "pair"
    return write_pair_package(root, TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS, tokenizer_path)


@pytest.fixture(scope="session")
def pair_root_fp16(tmp_path_factory, pair_root) -> Path:
    return convert(pair_root, tmp_path_factory.mktemp("export") / "pair-fp16", "float16")


@pytest.fixture(scope="session")
def pair_roots(pair_root, pair_root_fp16) -> dict[str, Path]:
    return {"float32": pair_root, "float16": pair_root_fp16}


@pytest.fixture(scope="session")
def decoder_root(tmp_path_factory, tokenizer_path) -> Path:
    root = tmp_path_factory.mktemp("export") / "draft"
    return write_decoder_package(root, DRAFT_WEIGHTS, DRAFT_CONFIG, tokenizer_path)
