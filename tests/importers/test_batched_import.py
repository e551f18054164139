"""`speculant import --batch N` (docs/design/batching.md): the tiny GGUF's package gains the
batched pass ``decoder/batched.onnx`` (its GGUF blocks kept as MatMulNBits, or int4 with
``--quantize int4``, as the batch-1 graph's) and the metadata's ``update.batch``, which
`speculant inspect` prints; each row of a ragged batch equals its pass alone. Bad values,
the appended form, a sliding-window model and the imports that keep no Llama graph of ours
are refused by field, before anything is written."""

from __future__ import annotations

import json

import onnx
import pytest
import yaml
from family_models import write_hf_folder
from typer.testing import CliRunner

from speculant.cli import full_app
from speculant_tools.export.errors import ExportError
from speculant_tools.importers import ImporterError, import_model
from static_cache.static_driver import batched_against_alone

app = full_app()
BLOCKS = [[7, 3, 41, 12, 25], [9, 2], [], [33, 18, 2]]  # row 2 pads the batch


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def inspected_batch(root) -> str:
    result = cli("inspect", root, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["batch"]


def update_of(root) -> dict:
    document = yaml.safe_load((root / "inference_metadata.yaml").read_text())
    return document["pipeline"]["workflow"]["serving"]["state_service"]["groups"][
        "attention"]["update"]


def ops(path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.mark.parametrize("quantize", [None, "int4"])
def test_import_batch_writes_the_batched_pass(gguf_path, tmp_path, quantize):
    out = tmp_path / "package"
    result = cli("import", gguf_path, out, "--batch", 4,
                 *(["--quantize", quantize] if quantize else []))
    assert result.exit_code == 0, result.output
    assert update_of(out)["batch"] == {"max_rows": 4,
                                       "artifacts": {"decoder": "decoder/batched.onnx"},
                                       "block_lengths_ports": {"decoder": "block_lengths"}}
    assert inspected_batch(out) == "up to 4 rows (decoder/batched.onnx)"
    single, batched = ops(out / "decoder" / "model.onnx"), ops(out / "decoder" / "batched.onnx")
    # the GGUF's Q4_0 layers kept (2 per layer), or every linear layer int4 (7 per layer
    # and the LM head): the batched pass computes with the batch-1 graph's weights
    assert batched["MatMulNBits"] == single["MatMulNBits"] == (15 if quantize else 4)
    assert max(batched_against_alone(out, BLOCKS, component="decoder")) < 1e-4


def test_import_without_batch_stays_batch_1(imported):
    assert "batch" not in update_of(imported)
    assert not (imported / "decoder" / "batched.onnx").exists()
    assert inspected_batch(imported) == "1 only"


@pytest.mark.parametrize(("args", "field", "value"), [
    (["--batch", "0"], "batch", "0"), (["--batch", "-3"], "batch", "-3"),
    (["--batch", "4", "--cache", "appended"], "cache", "appended")])
def test_bad_batch_flags_exit_2_naming_the_field(gguf_path, tmp_path, args, field, value):
    result = cli("import", gguf_path, tmp_path / "out", *args)
    assert result.exit_code == 2, result.output
    assert "ExportError" in result.stderr and field in result.stderr and value in result.stderr
    assert "--batch" in result.stderr or "--cache static" in result.stderr  # the remedy
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_a_batch_that_is_no_integer_is_refused_naming_it(gguf_path, tmp_path):
    result = cli("import", gguf_path, tmp_path / "out", "--batch", "2.5")
    assert result.exit_code == 2 and "ExportError" in result.stderr
    assert "--batch" in result.stderr and "2.5" in result.stderr
    with pytest.raises(ExportError) as caught:  # the API: a bool is no row count
        import_model(gguf_path, tmp_path / "api", batch=True)
    assert caught.value.problems[0].path == "batch"
    assert not (tmp_path / "api").exists()


def test_a_sliding_window_model_is_refused_by_its_field(tmp_path):
    with pytest.raises(ExportError) as caught:
        import_model(write_hf_folder(tmp_path / "hf", "gemma2"), tmp_path / "out", batch=2)
    assert caught.value.problems[0].path == "config.sliding_window"
    assert "batch" in str(caught.value)  # the remedy: leave --batch out
    assert not any((tmp_path / "out").glob("*/*.onnx"))


@pytest.mark.parametrize(("kind", "marker", "text"), [
    ("genai", "genai_config.json", "{}"),
    ("speculators", "config.json", '{"speculators_config": {}}')])
def test_imports_that_keep_no_graph_of_ours_refuse_batch(tmp_path, kind, marker, text):
    source = tmp_path / kind
    source.mkdir()
    (source / marker).write_text(text)
    with pytest.raises(ImporterError) as caught:
        import_model(source, tmp_path / "out", batch=4, target="demo")
    assert caught.value.problems[0].path == "batch" and kind in str(caught.value)
    assert not (tmp_path / "out").exists()
