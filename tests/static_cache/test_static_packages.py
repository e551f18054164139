"""Static-cache packages on disk: catalogue document 18's metadata form, what the runtime says
about them today, converting between the forms, the `--cache` option."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from static_driver import AppendedTarget, StaticTarget, greedy
from typer.testing import CliRunner

import speculant
from speculant.cli import full_app
from speculant.package import load_metadata_only
from speculant_tools.export import ExportError, convert
from speculant_tools.export.package import read_settings

SCHEMA = Path(__file__).resolve().parents[3] / "shared" / "conformance" / \
    "inference_metadata.schema.json"
PROMPT = [7, 3, 41, 12, 25, 9]


def document(root: Path) -> dict:
    return yaml.safe_load((root / "inference_metadata.yaml").read_text())


def test_the_metadata_has_catalogue_18s_form(pairs):
    """Cells of extent `capacity` (recurrence invariant), the length cell, the group's
    logical_lengths and indexed_scatter update naming the ports of both components."""
    workflow = document(pairs["gqa-float16", "static"])["pipeline"]["workflow"]
    cell = workflow["state"]["kv.1.key"]
    assert cell["contract"]["shape"] == ["batch", 2, "capacity", 16]
    assert cell["recurrence"] == {"kind": "invariant"}
    assert workflow["state"]["cache_lengths"]["initializer"] == "request.cache_lengths"
    group = workflow["serving"]["state_service"]["groups"]["attention"]
    assert group["logical_lengths"] == "cache_lengths"
    assert group["update"] == {
        "kind": "indexed_scatter", "write_indices": "cache_lengths",
        "capacity": "package.capacity", "write_indices_ports": {"target": "cache_lengths"},
        "kv_length_ports": {"target": "cache_lengths", "assistant": "cache_lengths"}}
    assert workflow["inputs"]["package.capacity"]["default"] == 64  # the context
    assert "request.attention_mask" not in workflow["inputs"]
    for component in workflow["components"].values():
        assert "attention_mask" not in component["ports"]["inputs"]
        assert component["ports"]["inputs"]["cache_lengths"]["shape"] == ["batch"]
    borrowed = workflow["components"]["assistant"]["ports"]["inputs"]["shared_kv.key"]
    assert borrowed["shape"] == ["batch", 2, "capacity", 16]
    assert workflow["steps"][1]["inputs"]["cache_lengths"] == "request.cache_lengths"


def test_static_documents_validate_and_load(pairs, draft_packages):
    """Valid against the published schema, nothing unsupported, and they load (the runtime
    drives them: tests/static_cache/test_runtime_*.py)."""
    jsonschema = pytest.importorskip("jsonschema")
    if not SCHEMA.is_file():
        pytest.skip(f"no published schema at {SCHEMA} (a clone without ../shared)")
    schema = json.loads(SCHEMA.read_text())
    for root in (pairs["gqa-float16", "static"], draft_packages["static"]):
        jsonschema.validate(document(root), schema)
        _, problems = load_metadata_only(root / "inference_metadata.yaml")
        assert problems == []
    assert speculant.load(pairs["gqa-float16", "static"]).package.plan.static is not None


def test_appended_packages_are_unchanged(pairs):
    workflow = document(pairs["gqa-float16", "appended"])["pipeline"]["workflow"]
    group = workflow["serving"]["state_service"]["groups"]["attention"]
    assert group["update"] == {"kind": "append"} and "logical_lengths" not in group
    assert read_settings(pairs["gqa-float16", "appended"]).cache == "appended"
    speculant.load(pairs["gqa-float16", "appended"])


def test_convert_keeps_or_changes_the_cache_form(pairs, tmp_path):
    static = pairs["scatter-float32", "static"]
    assert read_settings(static).cache == "static"
    kept = convert(static, tmp_path / "fp16", "float16")
    assert read_settings(kept).cache == "static"
    back = convert(static, tmp_path / "appended", "float32", graph="explicit", cache="appended")
    assert read_settings(back).cache == "appended"
    assert greedy(AppendedTarget(back), PROMPT, 10) == greedy(StaticTarget(static, 32), PROMPT,
                                                              10)
    np.testing.assert_array_equal(AppendedTarget(back).run(PROMPT),
                                  AppendedTarget(pairs["scatter-float32", "appended"]).run(PROMPT))
    with pytest.raises(ExportError, match="cache must be one of") as refused:
        convert(static, tmp_path / "bad", cache="paged")
    assert "--cache static" in refused.value.problems[0].remedy


def test_the_cache_option_of_convert(pairs, tmp_path):
    runner = CliRunner()
    source = pairs["gqa-float16", "appended"]
    done = runner.invoke(full_app(), ["convert", str(source), str(tmp_path / "s"),
                                      "--cache", "static"])
    assert done.exit_code == 0, done.output
    assert read_settings(tmp_path / "s").cache == "static"
    refused = runner.invoke(full_app(), ["convert", str(source), str(tmp_path / "x"),
                                         "--cache", "paged"])
    assert refused.exit_code == 2 and "cache" in refused.stderr
    assert "Traceback" not in refused.output
