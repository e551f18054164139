"""A static package written with ``batch=N`` (docs/design/batching.md): its batch-1 graphs
are the plain static package's, byte for byte, it still loads and decodes at batch 1, its
``target/batched.onnx`` runs a ragged batch equal to each row alone, and the metadata's
``update.batch`` says how many rows; `speculant inspect` prints it ("batch 1 only" for a
package without it). Bad ``batch`` values are refused by field."""

from __future__ import annotations

import json

import pytest
import yaml
from static_driver import BatchedTarget, StaticTarget
from test_batched_pass import CAPACITY, PREFILL, VERIFY, random_fill, run_checked
from typer.testing import CliRunner

import speculant
from export.export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS
from speculant.cli import full_app
from speculant_tools.export import write_pair_package
from speculant_tools.export.errors import ExportError


@pytest.fixture(scope="module")
def batched_pair(tmp_path_factory, tokenizer_file):
    return write_pair_package(tmp_path_factory.mktemp("batched-pair") / "pair", TARGET_WEIGHTS,
                              CONFIG, DRAFTER_WEIGHTS, tokenizer_file, graph="explicit",
                              cache="static", batch=4)


def inspect(root) -> dict:
    result = CliRunner().invoke(full_app(), ["inspect", str(root), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_batch1_graphs_are_the_static_packages(batched_pair, pairs):
    plain = pairs["scatter-float32", "static"]
    for artifact in ("target/model.onnx", "assistant/model.onnx"):
        assert (batched_pair / artifact).read_bytes() == (plain / artifact).read_bytes()
    document = yaml.safe_load((batched_pair / "inference_metadata.yaml").read_text())
    update = document["pipeline"]["workflow"]["serving"]["state_service"]["groups"][
        "attention"]["update"]
    assert update["batch"] == {"max_rows": 4, "artifacts": {"target": "target/batched.onnx",
                                                            "assistant": "assistant/model.onnx"},
                               "block_lengths_ports": {"target": "block_lengths"}}


def test_it_decodes_at_batch_1_and_its_batched_graph_batches(batched_pair, pairs):
    prompt = [7, 3, 41, 12]
    plain = speculant.load(pairs["scatter-float32", "static"]).generate(prompt,
                                                                       max_new_tokens=6)
    got = speculant.load(batched_pair).generate(prompt, max_new_tokens=6)
    assert got.token_ids == plain.token_ids and len(got.token_ids) == 6
    rows = len(PREFILL)
    batch = BatchedTarget(batched_pair / "target" / "batched.onnx", rows, CAPACITY,
                          random_fill(rows))
    singles = [StaticTarget(batched_pair, CAPACITY) for _ in range(rows)]
    run_checked(batch, singles, PREFILL)
    run_checked(batch, singles, VERIFY)


def test_inspect_says_how_many_rows(batched_pair, pairs):
    assert inspect(batched_pair)["batch"] == \
        "up to 4 rows (target/batched.onnx, assistant/model.onnx)"
    assert inspect(pairs["scatter-float32", "static"])["batch"] == "1 only"
    text = CliRunner().invoke(full_app(), ["inspect", str(batched_pair)]).stdout
    assert "batch" in text and "up to 4 rows" in text


@pytest.mark.parametrize(("batch", "cache", "field"), [
    (0, "static", "batch"), (True, "static", "batch"), (2.5, "static", "batch"),
    (4, "appended", "cache")])
def test_bad_batch_values_are_refused_by_field(tmp_path, tokenizer_file, batch, cache, field):
    with pytest.raises(ExportError) as caught:
        write_pair_package(tmp_path / "p", TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS,
                           tokenizer_file, cache=cache, batch=batch)
    assert caught.value.problems[0].path == field
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(("field", "value", "path"), [
    ("max_rows", 0, "update.batch.max_rows"), ("max_rows", "4", "update.batch.max_rows"),
    ("artifacts", {"nobody": "x.onnx"}, "update.batch.artifacts"),
    ("block_lengths_ports", ["block_lengths"], "update.batch.block_lengths_ports")])
def test_a_malformed_batch_declaration_is_a_metadata_error(batched_pair, tmp_path, field,
                                                           value, path):
    from speculant.errors import MetadataError
    from speculant.package import load_metadata_only

    document = yaml.safe_load((batched_pair / "inference_metadata.yaml").read_text())
    groups = document["pipeline"]["workflow"]["serving"]["state_service"]["groups"]
    groups["attention"]["update"]["batch"][field] = value
    broken = tmp_path / "inference_metadata.yaml"
    broken.write_text(yaml.safe_dump(document))
    with pytest.raises(MetadataError) as caught:
        load_metadata_only(broken)
    assert any(p.path.endswith(path) for p in caught.value.problems), caught.value
