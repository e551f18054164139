"""Discovery and parsing (metadata.md §1 rule 4, §2.1): one test per message, no model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from package_builders import GREEDY, WF, base, setv, write_package

from speculant.errors import MetadataError
from speculant.package import load_package, read_document
from speculant.package.document import find_metadata


def write(tmp_path: Path, text: str, name: str = "inference_metadata.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def raised(path: Path) -> MetadataError:
    with pytest.raises(MetadataError) as info:
        read_document(path)
    return info.value


def test_base_documents_parse() -> None:
    doc = read_document(GREEDY)
    assert doc.workflow.components["decoder"].implementation.artifact == "decoder/model.onnx"


def test_no_metadata_file(tmp_path: Path) -> None:
    with pytest.raises(MetadataError, match=r"no inference_metadata\.\{yaml,yml,json\} in"):
        load_package(tmp_path)


def test_discovery_order_yaml_then_yml_then_json(tmp_path: Path) -> None:
    write(tmp_path, "{not json", "inference_metadata.json")
    write(tmp_path, "x: 1\n", "inference_metadata.yml")
    assert find_metadata(tmp_path).name == "inference_metadata.yml"
    write(tmp_path, "x: 1\n", "inference_metadata.yaml")
    assert find_metadata(tmp_path).name == "inference_metadata.yaml"


def test_discovery_skips_a_folder_of_that_name(tmp_path: Path) -> None:
    (tmp_path / "inference_metadata.yaml").mkdir()
    write(tmp_path, "{}", "inference_metadata.json")
    assert find_metadata(tmp_path).name == "inference_metadata.json"


def test_malformed_yaml(tmp_path: Path) -> None:
    error = raised(write(tmp_path, "pipeline: [unclosed\n"))
    assert "parse error" in str(error)


def test_duplicate_key(tmp_path: Path) -> None:
    text = GREEDY.read_text().replace("schema_version: v1\n", "schema_version: v1\n"
                                      "schema_version: v1\n")
    error = raised(write(tmp_path, text))
    assert "duplicate key 'schema_version'" in str(error)


def test_duplicate_key_nested(tmp_path: Path) -> None:
    text = GREEDY.read_text().replace("  vocab_size: 32\n  max_sequence_length: 64\n",
                                      "  vocab_size: 32\n  vocab_size: 32\n", 1)
    assert "duplicate key 'vocab_size'" in str(raised(write(tmp_path, text)))


def test_root_not_a_mapping(tmp_path: Path) -> None:
    error = raised(write(tmp_path, "- 1\n- 2\n"))
    assert "root is not a mapping" in str(error)


def test_json_strict(tmp_path: Path) -> None:
    doc = base("greedy")
    path = write(tmp_path, json.dumps(doc), "inference_metadata.json")
    assert read_document(path).schema_version == "v1"
    assert "duplicate key" in str(raised(write(tmp_path, '{"a": 1, "a": 2}', "d.json")))
    assert "NaN" in str(raised(write(tmp_path, '{"a": NaN}', "n.json")))
    assert "root is not a mapping" in str(raised(write(tmp_path, "[]", "l.json")))


def check(tmp_path: Path, doc: dict, path: str, message: str) -> MetadataError:
    error = raised(write(tmp_path, yaml.safe_dump(doc)))
    assert path in error.paths, error
    assert all(p.kind is MetadataError for p in error.problems)
    assert message in str(error)
    return error


def test_unknown_key(tmp_path: Path) -> None:
    doc = setv(base("greedy"), f"{WF}.components.decoder.colour", "blue")
    error = check(tmp_path, doc, f"{WF}.components.decoder.colour", "unknown key 'colour'")
    assert "implementation" in error.problems[0].expected  # lists the keys it accepts


def test_unknown_key_in_a_step(tmp_path: Path) -> None:
    doc = setv(base("greedy"), f"{WF}.steps.0.colour", "blue")
    check(tmp_path, doc, f"{WF}.steps.0.colour", "unknown key 'colour'")


def test_missing_required_field(tmp_path: Path) -> None:
    doc = base("greedy")
    del doc["pipeline"]["workflow"]["manifest"]
    check(tmp_path, doc, f"{WF}.manifest", "missing required key 'manifest'")


def test_rank_differs_from_shape(tmp_path: Path) -> None:
    doc = setv(base("greedy"), f"{WF}.inputs.request.input_ids.contract.rank", 3)
    check(tmp_path, doc, f"{WF}.inputs.request.input_ids.contract.rank", "rank 3 != len(shape) 2")


def test_unknown_dtype(tmp_path: Path) -> None:
    doc = setv(base("greedy"), f"{WF}.outputs.logits.contract.dtype", "string")
    error = check(tmp_path, doc, f"{WF}.outputs.logits.contract.dtype", "unknown dtype 'string'")
    assert error.problems[0].value == "string"


def test_batch_layout_axis_not_below_rank(tmp_path: Path) -> None:
    doc = setv(base("greedy"), f"{WF}.inputs.request.active.contract.batch_layout.axis", 1)
    check(tmp_path, doc, f"{WF}.inputs.request.active.contract.batch_layout.axis",
          "batch_layout.axis 1 >= rank 1")


def test_negative_extent_is_one_problem(tmp_path: Path) -> None:
    doc = setv(base("greedy"), f"{WF}.inputs.request.past.0.key.contract.shape.1", -2)
    error = check(tmp_path, doc, f"{WF}.inputs.request.past.0.key.contract.shape.1",
                  "matches none of the accepted forms")
    assert len(error.problems) == 1 and error.problems[0].value == -2


def test_wrong_scalar_type_is_not_coerced(tmp_path: Path) -> None:
    doc = setv(base("chained"), "speculative.max_proposal_width", "4")
    check(tmp_path, doc, "speculative.max_proposal_width", "valid integer")


def test_dtype_aliases_normalize(tmp_path: Path) -> None:
    doc = setv(base("greedy"), f"{WF}.outputs.logits.contract.dtype", "fp32")
    assert read_document(write(tmp_path, yaml.safe_dump(doc))).workflow.outputs[
        "logits"].contract.dtype == "float32"


def test_all_parse_problems_reported_together(tmp_path: Path) -> None:
    doc = base("greedy")
    setv(doc, f"{WF}.components.decoder.colour", "blue")
    setv(doc, f"{WF}.outputs.logits.contract.dtype", "string")
    setv(doc, f"{WF}.state.kv.0.key.scope", "forever")
    error = raised(write(tmp_path, yaml.safe_dump(doc)))
    assert {f"{WF}.components.decoder.colour", f"{WF}.outputs.logits.contract.dtype",
            f"{WF}.state.kv.0.key.scope"} <= set(error.paths)
    assert str(error).startswith("3 problems:")


def test_load_package_reports_the_file(tmp_path: Path) -> None:
    doc = setv(base("greedy"), f"{WF}.outputs.logits.contract.dtype", "string")
    write_package(tmp_path, doc)
    with pytest.raises(MetadataError) as info:
        load_package(tmp_path)
    assert info.value.problems[0].file.endswith("inference_metadata.yaml")
