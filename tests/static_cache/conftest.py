"""The export tests' tiny pair (tests/export/export_models.py) in both cache forms, written
once per session: float32 node by node (the indexed-scatter form), float16 and float32 fused
(GroupQueryAttention on a shared buffer), and the separate draft model."""

from __future__ import annotations

from pathlib import Path

import pytest
from static_driver import FORMS

from export.export_models import (
    CONFIG,
    DRAFT_CONFIG,
    DRAFT_WEIGHTS,
    DRAFTER_WEIGHTS,
    TARGET_WEIGHTS,
    write_tokenizer,
)
from speculant_tools.export import write_decoder_package, write_pair_package


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")


@pytest.fixture(scope="session")
def pairs(tmp_path_factory, tokenizer_file) -> dict[tuple[str, str], Path]:
    """(form, cache) -> package root, for every form and both caches."""
    base = tmp_path_factory.mktemp("static-cache")
    roots = {}
    for form, (dtype, graph) in FORMS.items():
        for cache in ("appended", "static"):
            roots[form, cache] = write_pair_package(
                base / f"{form}-{cache}", TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS,
                tokenizer_file, dtype=dtype, graph=graph, cache=cache)
    return roots


@pytest.fixture(scope="session")
def draft_packages(tmp_path_factory, tokenizer_file) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("static-draft")
    return {cache: write_decoder_package(base / cache, DRAFT_WEIGHTS, DRAFT_CONFIG,
                                         tokenizer_file, cache=cache)
            for cache in ("appended", "static")}


@pytest.fixture(scope="session")
def demo_static(tmp_path_factory) -> Path:
    """The bundled (trained) demo pair rebuilt with static caches, node by node float32."""
    import speculant
    from speculant_tools.export import convert

    demo = Path(speculant.__file__).parent / "demo"
    return convert(demo, tmp_path_factory.mktemp("demo") / "static", "float32", cache="static")
