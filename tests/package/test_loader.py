"""load_metadata_only and summarize: what `speculant inspect` shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from package_builders import CHAINED, GREEDY, WF, base, mutated, write_package

from speculant.errors import MetadataError
from speculant.package import load_metadata_only, load_package, read_document, summarize
from speculant.package.document import to_document


def test_metadata_only_accepts_a_file_or_a_folder(tmp_path: Path) -> None:
    doc, problems = load_metadata_only(GREEDY)
    assert problems == [] and doc.workflow.components
    write_package(tmp_path, base("greedy"), graphs={"decoder": None}, tokenizer=False)
    doc, problems = load_metadata_only(tmp_path)  # artifacts are not needed
    assert problems == []


def test_metadata_only_raises_metadata_errors(tmp_path: Path) -> None:
    write_package(tmp_path, mutated("greedy", ("set", f"{WF}.steps.1.output", "scores")))
    with pytest.raises(MetadataError) as info:
        load_metadata_only(tmp_path / "inference_metadata.yaml")
    assert info.value.paths == [f"{WF}.steps.1.output"]


def test_summary_of_the_greedy_example() -> None:
    summary = summarize(read_document(GREEDY))
    json.dumps(summary)
    decoder = summary["components"]["decoder"]
    assert decoder["role"] == "target" and decoder["artifact"] == "decoder/model.onnx"
    assert decoder["inputs"]["input_ids"] == {"dtype": "int64", "shape": ["batch", "sequence"]}
    assert summary["state_groups"]["attention"] == {
        "kind": "full_attention", "update": "append", "cells": ["kv.0.key", "kv.0.value"],
        "sequence_axis": 2, "rollback_positions": 4,
        "aliases": {"decoder": {"kv.0.key": "read_write", "kv.0.value": "read_write"}}}
    assert summary["speculative"] is None


def test_summary_of_the_chained_example() -> None:
    spec = summarize(read_document(CHAINED))["speculative"]
    assert spec["proposal_execution"] == "chained" and spec["max_proposal_width"] == 4
    assert (spec["currency"], spec["fused_width"], spec["carry_width"]) == ("float16", 32, 16)
    assert spec["token_embedding"] == {"component": "target",
                                       "table": "model.embed_tokens.weight", "scale": 4.0}
    assert spec["position_symbol"] == "sequence"
    assert set(spec["borrowed_cache_symbols"].values()) == {"kv_sequence"}


def test_summary_without_a_pipeline() -> None:
    doc = base("greedy")
    del doc["pipeline"]
    summary = summarize(to_document(doc, "<test>"))
    assert summary["components"] == {} and summary["speculative"] is None


def test_load_derives_the_plan(tmp_path: Path) -> None:
    package = load_package(write_package(tmp_path, base("chained")))
    plan = package.plan
    assert (plan.target, plan.proposer) == ("target", "assistant")
    assert plan.cells["kv.full.key"].owner_output == "present.1.key"
    assert plan.rollback_bound == 4 and plan.eos_ids == (1,)
    assert package.embedding_width == 16
