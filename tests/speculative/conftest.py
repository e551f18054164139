"""Session-scoped packages and engines for the chained-speculation tests.

Every package is written once per session (keyed by its writer arguments); tests that plant
a defect on an engine's cached state (the scaled table) load a fresh engine from the same
root instead of touching the shared one.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import speculant
from builders import read_model, write_chained_package, write_decoder_package
from builders.writers import FORMATS, write_model

MAX_WIDTH = 8  # max_proposal_width = rollback_positions of the shared pair: k up to 8


@pytest.fixture(scope="session")
def pair_root(tmp_path_factory) -> Callable[..., Path]:
    """``pair_root(dtype="float32", fmt="textproto", **writer_knobs)``: the chained pair,
    written once per distinct argument set (``max_proposal_width`` 8 unless given)."""
    cache: dict[tuple, Path] = {}

    def get(dtype: str = "float32", fmt: str = "textproto", **knobs: Any) -> Path:
        knobs = {"max_proposal_width": MAX_WIDTH, "rollback_positions": MAX_WIDTH, **knobs}
        key = (dtype, fmt, tuple(sorted(knobs.items(), key=lambda kv: kv[0])))
        if key not in cache:
            root = tmp_path_factory.mktemp(f"pair-{dtype}-{fmt}")
            cache[key] = write_chained_package(root, dtype=dtype, fmt=fmt, **knobs)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def pair_engine(pair_root) -> Callable[..., speculant.Engine]:
    """``pair_engine(dtype, fmt)``: one shared engine per package. Never reset its table."""
    cache: dict[tuple[str, str], speculant.Engine] = {}

    def get(dtype: str = "float32", fmt: str = "textproto") -> speculant.Engine:
        if (dtype, fmt) not in cache:
            cache[(dtype, fmt)] = speculant.load(pair_root(dtype, fmt))
        return cache[(dtype, fmt)]

    return get


@pytest.fixture(scope="session")
def decoder_root(tmp_path_factory) -> Path:
    return write_decoder_package(tmp_path_factory.mktemp("decoder"))


@pytest.fixture(scope="session")
def edited_pair(pair_root, tmp_path_factory) -> Callable[..., Path]:
    """``edited_pair(name, edit_metadata, edit_target_graph=None)``: a copy of the float32
    textproto pair with its metadata document (a dict) and/or target graph edited in place;
    written once per ``name``."""
    cache: dict[str, Path] = {}

    def get(name: str, edit_metadata: Callable[[dict], None] | None = None,
            edit_target_graph: Callable[[Any], None] | None = None) -> Path:
        if name not in cache:
            root = tmp_path_factory.mktemp(f"edited-{name}")
            shutil.copytree(pair_root(), root, dirs_exist_ok=True)
            if edit_metadata is not None:
                path = root / "inference_metadata.yaml"
                document = yaml.safe_load(path.read_text())
                edit_metadata(document)
                path.write_text(yaml.safe_dump(document, sort_keys=False))
            if edit_target_graph is not None:
                path = root / f"target/model{FORMATS['textproto']}"
                model = read_model(path)
                edit_target_graph(model)
                write_model(model, path)
            cache[name] = root
        return cache[name]

    return get


@pytest.fixture(scope="session")
def recorded(pair_engine):
    """``recorded(prompt, k, dtype="float32", fmt="textproto")``: one recorded speculative
    run of the shared engine (``chain_helpers.run_recorded``), memoized for the session so
    the equality, trace, accounting and extent tests check the same runs."""
    from chain_helpers import run_recorded

    cache: dict[tuple, Any] = {}

    def get(prompt, k: int, dtype: str = "float32", fmt: str = "textproto"):
        key = (tuple(prompt), k, dtype, fmt)
        if key not in cache:
            with pytest.MonkeyPatch.context() as mp:
                cache[key] = run_recorded(pair_engine(dtype, fmt), mp, prompt, k)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def plain_greedy(pair_engine):
    """``plain_greedy(prompt, dtype="float32", fmt="textproto")``: the generated tokens of
    the same engine decoding without a proposer, memoized."""
    from chain_helpers import MAX_NEW

    cache: dict[tuple, list[int]] = {}

    def get(prompt, dtype: str = "float32", fmt: str = "textproto") -> list[int]:
        key = (tuple(prompt), dtype, fmt)
        if key not in cache:
            engine = pair_engine(dtype, fmt)
            result = engine.generate(list(prompt), MAX_NEW)
            assert result.stats.rounds == 0 and result.stats.proposer_invocations == 0
            cache[key] = result.token_ids
        return cache[key]

    return get


# -- draft-model and prompt-lookup fixtures -----------------------------------------------------
@pytest.fixture(scope="session")
def decoder8_root(tmp_path_factory) -> Path:
    """The greedy decoder (the shared fixture function) with rollback_positions 8: the target
    of the draft-model and prompt-lookup tests, so k runs up to 8."""
    return write_decoder_package(tmp_path_factory.mktemp("decoder8"), rollback_positions=MAX_WIDTH)


@pytest.fixture(scope="session")
def draft_root(tmp_path_factory) -> Callable[..., Path]:
    """``draft_root(**writer_knobs)``: a decoder package used as a draft model, written once
    per knob set (rollback_positions 8 unless given)."""
    cache: dict[tuple, Path] = {}

    def get(**knobs: Any) -> Path:
        knobs = {"rollback_positions": MAX_WIDTH, **knobs}
        key = tuple(sorted((k, tuple(sorted(v)) if isinstance(v, (set, frozenset)) else v)
                           for k, v in knobs.items()))
        if key not in cache:
            cache[key] = write_decoder_package(tmp_path_factory.mktemp("draft"), **knobs)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def draft_engine(decoder8_root, draft_root) -> Callable[..., speculant.Engine]:
    """``draft_engine(target=None, **draft_knobs)``: the target (default: the decoder with
    rollback_positions 8) loaded with a draft model, one engine per argument set."""
    cache: dict[tuple, speculant.Engine] = {}

    def get(target: Path | None = None, **knobs: Any) -> speculant.Engine:
        root = draft_root(**knobs)
        key = (target or decoder8_root, root)
        if key not in cache:
            cache[key] = speculant.load(target or decoder8_root, draft=root)
        return cache[key]

    return get
