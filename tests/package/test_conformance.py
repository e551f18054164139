"""Published documents (../shared/conformance) validate at metadata level and summarize; those
using features speculant cannot execute report them as UnsupportedError with their path, and
fail a runnable load. The §8 examples validate against the published JSON schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from package_builders import CHAINED, GREEDY, SHARED, WF, write_package

from speculant.errors import UnsupportedError
from speculant.package import (
    load_metadata_only,
    load_package,
    read_document,
    summarize,
    validate_document,
)

GROUPS = f"{WF}.serving.state_service.groups"


@pytest.fixture(scope="module")
def conformance() -> Path:
    folder = SHARED / "conformance"
    if not folder.is_dir():
        pytest.skip(f"no conformance documents at {folder} (a clone without ../shared)")
    return folder


def documents(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.yaml"))


def test_every_published_document_validates_and_summarizes(conformance: Path) -> None:
    paths = documents(conformance)
    assert paths
    for path in paths:
        doc = read_document(path)
        assert validate_document(doc) == [], path.name
        summary = summarize(doc)
        json.dumps(summary)
        assert summary["components"], path.name
        assert summary["state_groups"], path.name
        assert "speculative" in summary


EXPECTED_UNSUPPORTED = {
    "01-gemma4-text-decoder.yaml": set(),
    "23-gemma4-e2b-decoder.yaml": set(),
    "16-linear-attention-recurrent.yaml": {
        f"{GROUPS}.linear_accumulator.kind", f"{GROUPS}.linear_accumulator.update.kind",
        f"{GROUPS}.linear_accumulator.sequence_axis",
        f"{WF}.components.model.ports.roles"},  # no token_ids or logits role to drive
    "18-static-cache-indexed-scatter.yaml": set(),  # static caches: runnable (its graph absent)
    "24-gemma4-e2b-assistant-speculative.yaml": {
        f"{WF}.components.assistant.ports.inputs.inputs_embeds.shape"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED_UNSUPPORTED))
def test_unsupported_features_of_published_documents(conformance: Path, name: str) -> None:
    doc, problems = load_metadata_only(conformance / name)
    assert {p.kind for p in problems} <= {UnsupportedError}
    assert {p.path for p in problems} == EXPECTED_UNSUPPORTED[name]


def test_recurrent_document_names_the_feature(conformance: Path) -> None:
    _, problems = load_metadata_only(conformance / "16-linear-attention-recurrent.yaml")
    messages = " | ".join(p.message for p in problems)
    assert "state group kind 'recurrent'" in messages and "state update 'replace'" in messages


def test_speculative_summary_of_the_published_pair(conformance: Path) -> None:
    doc = read_document(conformance / "24-gemma4-e2b-assistant-speculative.yaml")
    summary = summarize(doc)
    spec = summary["speculative"]
    assert spec["target"] == "target" and spec["proposer"] == "assistant"
    assert spec["fused_input"] == "inputs_embeds" and spec["currency"] == "float16"
    assert spec["folded_carry_seed"] == {"component": "target", "output": "hidden"}
    assert spec["position_symbol"] == "sequence"
    assert set(spec["borrowed_cache_symbols"].values()) == {"sequence"}
    assert summary["components"]["target"]["role"] == "target"
    assert summary["state_groups"]["full_attention"]["rollback_positions"] == 4
    assert summary["state_groups"]["full_attention"]["cells"] == [
        "full_key_0", "full_value_0", "full_key_1", "full_value_1"]


@pytest.mark.parametrize("name", ["16-linear-attention-recurrent.yaml",
                                  "24-gemma4-e2b-assistant-speculative.yaml"])
def test_runnable_load_refuses_unsupported_documents(conformance: Path, tmp_path: Path,
                                                      name: str) -> None:
    doc = yaml.safe_load((conformance / name).read_text())
    write_package(tmp_path, doc)  # graphs whose ports match, so only support can refuse
    with pytest.raises(UnsupportedError) as info:
        load_package(tmp_path)
    assert set(info.value.paths) == EXPECTED_UNSUPPORTED[name]


@pytest.mark.parametrize("name", ["01-gemma4-text-decoder.yaml", "23-gemma4-e2b-decoder.yaml"])
def test_runnable_load_of_supported_published_documents(conformance: Path, tmp_path: Path,
                                                         name: str) -> None:
    doc = yaml.safe_load((conformance / name).read_text())
    package = load_package(write_package(tmp_path, doc))
    assert package.plan.target == "decoder"
    assert set(package.plan.cells) == set(doc["pipeline"]["workflow"]["state"])


def test_runnable_load_of_the_static_cache_document(conformance: Path, tmp_path: Path) -> None:
    """Catalogue 18 loads (stub graphs with its ports): the cache is the target's cell, the
    length and write-index cells are the driver's, both bound to L on every pass."""
    doc = yaml.safe_load((conformance / "18-static-cache-indexed-scatter.yaml").read_text())
    plan = load_package(write_package(tmp_path, doc)).plan
    assert set(plan.cells) == {"cache"} and plan.static is not None
    assert (plan.static.lengths_cell, plan.static.capacity_input) == ("cache_lengths",
                                                                      "package.capacity")
    assert plan.driver_bound["request.cache_lengths"] == "cache_lengths"
    assert plan.driver_bound["request.write_indices"] == "cache_lengths"
    assert plan.static.capacity_symbol == "capacity"


@pytest.mark.parametrize("example", [GREEDY, CHAINED], ids=["8.1", "8.2"])
def test_examples_validate_against_the_published_schema(conformance: Path,
                                                        example: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((conformance / "inference_metadata.schema.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [e.message for e in validator.iter_errors(yaml.safe_load(example.read_text()))]
    assert errors == []
