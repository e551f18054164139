"""`speculant inspect`: components, ports, state groups and the speculative contract of a
package, or of one metadata document (`--metadata-only`, no artifacts), including every
published conformance document in ../shared/conformance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

CONFORMANCE = Path(__file__).resolve().parents[2].parent / "shared" / "conformance"
CONFORMANCE_FILES = sorted(CONFORMANCE.glob("*.yaml")) if CONFORMANCE.is_dir() else []


def flat(text: str) -> str:
    return " ".join(text.split())


def assert_clean_failure(result, *words: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    for word in words:
        assert word in flat(result.stderr), (word, result.stderr)


def test_inspect_chained_package_lists_everything(cli, chained_path):
    result = cli("inspect", chained_path)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for word in ("components", "target", "assistant",  # components
                 "input_ids", "past_key_values.0.key", "present.0.key", "hidden_states",
                 "inputs_embeds", "projected_state",  # ports
                 "state_groups", "attention", "kv.key", "kv.value", "rollback_positions",
                 "speculative", "max_proposal_width", "chained", "rollback_state"):
        assert word in out, word


def test_inspect_json_chained(cli, chained_path):
    result = cli("inspect", chained_path, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    components = summary["components"]
    assert set(components) == {"target", "assistant"}
    assert components["target"]["role"] == "target"
    assert components["assistant"]["role"] == "proposer"
    assert components["target"]["inputs"]["input_ids"] == {"dtype": "int64",
                                                           "shape": ["batch", "sequence"]}
    assert "projected_state" in components["assistant"]["outputs"]
    group = summary["state_groups"]["attention"]
    assert group["cells"] == ["kv.key", "kv.value"]
    assert (group["sequence_axis"], group["rollback_positions"]) == (2, 4)
    assert group["aliases"]["assistant"] == {"kv.key": "read_only", "kv.value": "read_only"}
    speculative = summary["speculative"]
    assert (speculative["target"], speculative["proposer"]) == ("target", "assistant")
    assert speculative["max_proposal_width"] == 4
    assert speculative["proposal_execution"] == "chained"
    assert summary["unsupported"] == []


def test_inspect_json_decoder_has_no_speculative_contract(cli, decoder_path):
    result = cli("inspect", decoder_path, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert set(summary["components"]) == {"decoder"}
    assert summary["components"]["decoder"]["role"] == "target"
    assert summary["speculative"] is None
    assert set(summary["state_groups"]) == {"attention"}


def test_inspect_metadata_only_on_a_package_file(cli, chained_path):
    result = cli("inspect", "--metadata-only", chained_path / "inference_metadata.yaml",
                 "--json")
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.stdout)["components"]) == {"target", "assistant"}


def test_inspect_metadata_only_needs_no_artifacts(cli, chained_path, tmp_path):
    lone = tmp_path / "inference_metadata.yaml"
    lone.write_text((chained_path / "inference_metadata.yaml").read_text())
    assert cli("inspect", "--metadata-only", lone).exit_code == 0
    assert_clean_failure(cli("inspect", tmp_path), "target")  # the full load needs them


def test_inspect_missing_package(cli, tmp_path):
    assert_clean_failure(cli("inspect", tmp_path / "missing"), "MetadataError", "missing")


def test_inspect_broken_document(cli, tmp_path):
    broken = tmp_path / "inference_metadata.yaml"
    broken.write_text("schema_version: v1\npipeline: 3\n")
    assert_clean_failure(cli("inspect", "--metadata-only", broken), "MetadataError")


def test_inspect_reports_unsupported_features_without_failing(cli, decoder_path, tmp_path):
    document = yaml.safe_load((decoder_path / "inference_metadata.yaml").read_text())
    document["pipeline"]["workflow"]["steps"].append(
        {"kind": "loop", "steps": [], "continue_when": "c", "max_iterations": "n"})
    path = tmp_path / "inference_metadata.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    result = cli("inspect", "--metadata-only", path, "--json")
    assert result.exit_code == 0, result.output
    unsupported = json.loads(result.stdout)["unsupported"]
    assert any(u.startswith("pipeline.workflow.steps.2.kind") and "loop" in u
               for u in unsupported), unsupported


@pytest.mark.parametrize("document", CONFORMANCE_FILES or [None],
                         ids=[p.name for p in CONFORMANCE_FILES] or ["absent"])
def test_inspect_metadata_only_conformance(cli, document):
    if document is None:
        pytest.skip(f"no conformance documents at {CONFORMANCE} (a user's clone has no "
                    "../shared)")
    expected = yaml.safe_load(document.read_text())
    workflow = expected["pipeline"]["workflow"]
    result = cli("inspect", "--metadata-only", document, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert set(summary["components"]) == set(workflow["components"])
    groups = workflow.get("serving", {}).get("state_service", {}).get("groups", {})
    assert set(summary["state_groups"]) == set(groups)
    assert (summary["speculative"] is None) == ("speculative" not in expected)
    plain = cli("inspect", "--metadata-only", document)
    assert plain.exit_code == 0, plain.output
    for component in workflow["components"]:
        assert f'"{component}"' in plain.stdout, component
