"""name_axes: every `sequence` axis renamed by its role, the file otherwise byte for byte."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from speculant.errors import MetadataError
from speculant_tools.name_axes import name_axes

DATA = Path(__file__).parent / "name_axes_data"
CHAINED = DATA / "chained_pair.yaml"  # metadata.md §8.2, verbatim
GREEDY = DATA / "greedy_decoder.yaml"  # metadata.md §8.1, verbatim
CONFORMANCE = Path(__file__).parents[2].parent / "shared" / "conformance"
GEMMA = CONFORMANCE / "24-gemma4-e2b-assistant-speculative.yaml"

DISTINCT_NAMES = r"\b(past_sequence|total_sequence|kv_sequence)\b"


def flatten(text: str) -> str:
    """The document as packages in circulation publish it: every sequence-like symbol in
    every shape list is `sequence`. Comments keep their words."""
    return re.sub(r"shape: \[[^]]*\]",
                  lambda shape: re.sub(DISTINCT_NAMES, "sequence", shape.group()), text)


def flattened_copy(source: Path, tmp_path: Path) -> Path:
    path = tmp_path / "inference_metadata.yaml"
    path.write_text(flatten(source.read_text()))
    return path


def contract_shapes(document: dict) -> dict[str, list]:
    """Every contract's shape in the document, by field path."""
    workflow = document["pipeline"]["workflow"]
    shapes = {}
    for section in ("inputs", "outputs", "state"):
        for name, entry in workflow.get(section, {}).items():
            shapes[f"{section}.{name}"] = entry["contract"].get("shape")
    for component, spec in workflow["components"].items():
        for direction in ("inputs", "outputs"):
            for port, contract in spec["ports"][direction].items():
                shapes[f"components.{component}.{direction}.{port}"] = contract.get("shape")
    return shapes


@pytest.mark.parametrize("source", [CHAINED, GREEDY], ids=["chained", "greedy"])
def test_flattened_example_gets_back_every_original_symbol(source: Path, tmp_path) -> None:
    path = flattened_copy(source, tmp_path)
    flat_shapes = contract_shapes(yaml.safe_load(path.read_text())).values()
    assert not {"past_sequence", "total_sequence", "kv_sequence"} & {
        symbol for shape in flat_shapes for symbol in shape or []}

    report = name_axes(path)

    original = contract_shapes(yaml.safe_load(source.read_text()))
    assert contract_shapes(yaml.safe_load(path.read_text())) == original
    assert report.is_written and report.has_renames


@pytest.mark.parametrize("source", [CHAINED, GREEDY], ids=["chained", "greedy"])
def test_comments_key_order_and_layout_survive_byte_for_byte(source: Path, tmp_path) -> None:
    path = flattened_copy(source, tmp_path)
    name_axes(path)
    assert path.read_bytes() == source.read_bytes()


def test_report_lists_each_renamed_field_path(tmp_path) -> None:
    report = name_axes(flattened_copy(CHAINED, tmp_path))
    renamed = {r.path: (r.old, r.new) for r in report.renames}
    components = "pipeline.workflow.components"
    assert renamed[f"{components}.assistant.ports.inputs.attention_mask.shape.1"] == (
        "sequence", "kv_sequence")
    assert renamed[f"{components}.assistant.ports.inputs.shared_kv.full_attention.key.shape.2"] \
        == ("sequence", "kv_sequence")
    assert renamed[f"{components}.target.ports.inputs.attention_mask.shape.1"] == (
        "sequence", "total_sequence")
    assert renamed[f"{components}.target.ports.outputs.present.1.value.shape.2"] == (
        "sequence", "total_sequence")
    assert renamed["pipeline.workflow.inputs.request.past.full.key.contract.shape.2"] == (
        "sequence", "past_sequence")
    assert renamed["pipeline.workflow.state.kv.sliding.value.contract.shape.2"] == (
        "sequence", "past_sequence")
    # The query keeps its name and is not reported.
    assert f"{components}.assistant.ports.inputs.position_ids.shape.1" not in renamed
    assert len(report.renames) == 23
    assert [r.line for r in report.renames] == sorted(r.line for r in report.renames)
    rendered = report.render()
    assert str(report) == rendered
    assert "renamed 23 shape symbols" in rendered
    assert ("pipeline.workflow.inputs.request.attention_mask.contract.shape.1: "
            "sequence -> total_sequence") in rendered


def test_a_dry_run_reports_but_leaves_the_file_alone(tmp_path) -> None:
    path = flattened_copy(CHAINED, tmp_path)
    before = path.read_bytes()
    report = name_axes(path, write=False)
    assert path.read_bytes() == before
    assert not report.is_written and len(report.renames) == 23
    assert "would rename 23" in report.render()


def test_a_document_with_distinct_names_is_not_rewritten(tmp_path) -> None:
    path = tmp_path / "inference_metadata.yaml"
    shutil.copy(CHAINED, path)
    modified = path.stat().st_mtime_ns
    report = name_axes(path)
    assert not report.has_renames and not report.is_written
    assert path.stat().st_mtime_ns == modified
    assert "already has a distinct name" in report.render()


def test_renaming_twice_changes_nothing_the_second_time(tmp_path) -> None:
    path = flattened_copy(GREEDY, tmp_path)
    assert name_axes(path).has_renames
    assert not name_axes(path).has_renames


def test_quoted_symbols_block_lists_and_crlf_are_edited_in_place(tmp_path) -> None:
    text = GREEDY.read_text()
    text = text.replace(
        "past_key_values.0.key: {dtype: float32, rank: 4, shape: [batch, 2, past_sequence, 8], "
        "batch_layout: {kind: request_aligned, axis: 0}}",
        "past_key_values.0.key:\n"
        "              dtype: float32   # a block mapping\n"
        "              rank: 4\n"
        "              shape:\n"
        "              - batch\n"
        "              - 2\n"
        "              -   'past_sequence'   # quoted, odd indent\n"
        "              - 8\n"
        "              batch_layout: {kind: request_aligned, axis: 0}")
    text = text.replace("shape: [batch, 2, total_sequence, 8]",
                        'shape: [batch, 2, "total_sequence", 8]', 1)
    assert "'past_sequence'" in text and '"total_sequence"' in text
    original = text.replace("\n", "\r\n").encode()
    flat = re.sub(DISTINCT_NAMES, "sequence", text)  # no comment of §8.1 names them
    path = tmp_path / "inference_metadata.yaml"
    path.write_bytes(flat.replace("\n", "\r\n").encode())

    name_axes(path)

    assert path.read_bytes() == original


def test_a_json_document_is_renamed_too(tmp_path) -> None:
    original = json.dumps(yaml.safe_load(GREEDY.read_text()), indent=2) + "\n"
    path = tmp_path / "inference_metadata.json"
    path.write_text(re.sub(DISTINCT_NAMES, "sequence", original))
    assert name_axes(path).has_renames
    assert path.read_text() == original


def test_a_symlinked_document_is_renamed_where_it_lives(tmp_path) -> None:
    real = flattened_copy(GREEDY, tmp_path)
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    name_axes(link)
    assert link.is_symlink()
    assert real.read_bytes() == GREEDY.read_bytes()


# -- refusals ---------------------------------------------------------------------------------
def refused(path: Path) -> MetadataError:
    before = path.read_bytes()
    with pytest.raises(MetadataError) as caught:
        name_axes(path)
    assert path.read_bytes() == before  # all or nothing
    assert all(problem.file == str(path) for problem in caught.value.problems)
    return caught.value


def test_an_input_bound_to_a_query_port_and_a_cache_port_is_refused(tmp_path) -> None:
    path = flattened_copy(CHAINED, tmp_path)
    text = path.read_text()
    # The target reads request.position_ids both as position ids and as its attention mask.
    text = text.replace("        attention_mask: request.attention_mask\n"
                        "        position_ids: request.position_ids\n"
                        "        past_key_values.0.key",
                        "        attention_mask: request.position_ids\n"
                        "        position_ids: request.position_ids\n"
                        "        past_key_values.0.key", 1)
    path.write_text(text)

    error = refused(path)

    assert error.paths == ["pipeline.workflow.inputs.request.position_ids.contract.shape.1"]
    message = str(error)
    assert "would need two names" in message
    assert "sequence because it is bound to target.position_ids" in message
    assert "total_sequence because it is bound to target.attention_mask" in message


def test_every_unclassifiable_axis_is_reported_together(tmp_path) -> None:
    path = flattened_copy(CHAINED, tmp_path)
    text = path.read_text()
    # An input port with no role, alias or chain meaning ...
    text = text.replace(
        "            position_ids: {dtype: int64, rank: 2, shape: [batch, sequence], "
        "batch_layout: {kind: request_aligned, axis: 0}}\n"
        "            past_key_values.0.key",
        "            position_ids: {dtype: int64, rank: 2, shape: [batch, sequence], "
        "batch_layout: {kind: request_aligned, axis: 0}}\n"
        "            token_type_ids: {dtype: int64, rank: 2, shape: [batch, sequence], "
        "optional: true}\n"
        "            past_key_values.0.key", 1)
    # ... and a cache port naming `sequence` off its group's sequence_axis.
    text = text.replace("past_key_values.0.value: {dtype: float16, rank: 4, "
                        "shape: [batch, 2, sequence, 8]",
                        "past_key_values.0.value: {dtype: float16, rank: 4, "
                        "shape: [batch, sequence, sequence, 8]", 1)
    path.write_text(text)

    error = refused(path)

    target = "pipeline.workflow.components.target.ports.inputs"
    assert error.paths == [f"{target}.token_type_ids.shape.1",
                           f"{target}.past_key_values.0.value.shape.1"]
    assert "input 'token_type_ids' of 'target' has no role" in str(error)
    assert "axis 1 is not group 'sliding_attention''s sequence_axis 2" in str(error)
    assert "Remedy: name the axis by hand" in str(error)


def test_a_yaml_anchor_shared_by_a_past_and_a_present_is_refused(tmp_path) -> None:
    path = flattened_copy(GREEDY, tmp_path)
    text = path.read_text()
    text = text.replace("past_key_values.0.key: {dtype: float32, rank: 4, "
                        "shape: [batch, 2, sequence, 8]",
                        "past_key_values.0.key: {dtype: float32, rank: 4, "
                        "shape: &kv [batch, 2, sequence, 8]", 1)
    text = text.replace("present.0.key: {dtype: float32, rank: 4, "
                        "shape: [batch, 2, sequence, 8]",
                        "present.0.key: {dtype: float32, rank: 4, shape: *kv", 1)
    path.write_text(text)

    error = refused(path)

    assert error.paths == ["pipeline.workflow.components.decoder.ports.outputs.present.0.key"
                           ".shape.2"]
    assert "shared through a YAML anchor" in str(error)


def test_unreadable_documents_are_metadata_errors(tmp_path) -> None:
    with pytest.raises(MetadataError, match="expected the metadata file, got a directory"):
        name_axes(tmp_path)
    duplicate = tmp_path / "inference_metadata.yaml"
    duplicate.write_text("schema_version: v1\nschema_version: v1\n")
    with pytest.raises(MetadataError, match="cannot parse the document"):
        name_axes(duplicate)
    no_workflow = tmp_path / "other.yaml"
    no_workflow.write_text("schema_version: v1\n")
    with pytest.raises(MetadataError) as caught:
        name_axes(no_workflow)
    assert caught.value.paths == ["pipeline", "pipeline.workflow"]


# -- a published package ----------------------------------------------------------------------
@pytest.mark.skipif(not GEMMA.is_file(), reason=f"conformance examples absent ({GEMMA})")
def test_the_published_gemma4_assistant_package_is_renamed(tmp_path) -> None:
    path = tmp_path / "inference_metadata.yaml"
    shutil.copy(GEMMA, path)

    report = name_axes(path)

    assert report.has_renames
    text = path.read_text()
    assert re.sub(DISTINCT_NAMES, "sequence", text) == GEMMA.read_text()  # only the symbols
    workflow = yaml.safe_load(text)["pipeline"]["workflow"]
    assistant = workflow["components"]["assistant"]["ports"]
    target = workflow["components"]["target"]["ports"]
    for group in ("full_attention", "sliding_attention"):
        for part in ("key", "value"):
            assert assistant["inputs"][f"shared_kv.{group}.{part}"]["shape"][2] == "kv_sequence"
    for port in ("full_key_0", "full_value_0", "full_key_1", "full_value_1", "sliding_key_0",
                 "sliding_value_0"):
        assert target["inputs"][port]["shape"][2] == "past_sequence"
        assert target["outputs"][f"next_{port}"]["shape"][2] == "total_sequence"
        assert workflow["inputs"][f"request.{port}"]["contract"]["shape"][2] == "past_sequence"
        assert workflow["state"][port]["contract"]["shape"][2] == "past_sequence"
    # The query keeps `sequence`: σ ≠ κ now.
    assert assistant["inputs"]["inputs_embeds"]["shape"][1] == "sequence"
    assert target["inputs"]["input_ids"]["shape"][1] == "sequence"
    assert assistant["outputs"]["next_projected_state"]["shape"][1] == "sequence"
