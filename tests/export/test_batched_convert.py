"""`speculant convert --batch N` and `speculant scale-target --batch N` on the tiny export pair
(docs/design/batching.md): the result has ``target/batched.onnx``, whose rows each equal
their pass alone on ``target/model.onnx``, and ``update.batch`` (the drafter's own artifact
declared beside it), which `speculant inspect` prints. A rebuild keeps its source's batch
where the caches stay static; bad values and the appended form are refused by field."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from speculant.cli import full_app
from static_cache.static_driver import batched_against_alone

app = full_app()
BLOCKS = [[7, 3, 41, 12, 25], [], [9, 2], [33, 48, 2]]  # row 1 pads the batch
ROWS = "up to 4 rows (target/batched.onnx, assistant/model.onnx)"


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def inspected_batch(root) -> str:
    result = cli("inspect", root, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["batch"]


@pytest.fixture(scope="module")
def batched(pair_root, tmp_path_factory):
    """The appended float32 pair converted to static caches with ``--batch 4``."""
    out = tmp_path_factory.mktemp("convert") / "batched"
    result = cli("convert", pair_root, out, "--dtype", "float32", "--cache", "static",
                 "--batch", 4)
    assert result.exit_code == 0, result.output
    return out


def test_convert_batch_writes_the_batched_pass(batched, pair_root):
    assert inspected_batch(batched) == ROWS
    assert inspected_batch(pair_root) == "1 only"
    assert max(batched_against_alone(batched, BLOCKS)) < 1e-5


def test_a_rebuild_keeps_the_batch_where_the_caches_stay_static(batched, tmp_path):
    result = cli("convert", batched, tmp_path / "fp16")  # float16, the source's static caches
    assert result.exit_code == 0, result.output
    assert inspected_batch(tmp_path / "fp16") == ROWS
    # float16 (the batch-1 graph GroupQueryAttention, the batched ONNX Attention): logits of
    # magnitude ~20 within a few float16 steps (2^-6 there)
    assert max(batched_against_alone(tmp_path / "fp16", BLOCKS)) < 0.25
    result = cli("convert", batched, tmp_path / "other", "--dtype", "float32", "--batch", 2)
    assert result.exit_code == 0, result.output
    assert inspected_batch(tmp_path / "other") == ROWS.replace("4", "2")
    result = cli("convert", batched, tmp_path / "appended", "--cache", "appended")
    assert result.exit_code == 0, result.output
    assert inspected_batch(tmp_path / "appended") == "1 only"
    assert not (tmp_path / "appended" / "target" / "batched.onnx").exists()


@pytest.mark.parametrize("command", ["convert", "scale-target"])
@pytest.mark.parametrize(("args", "field", "value"), [
    (["--batch", "0"], "batch", "0"), (["--batch", "two"], "batch", "two"),
    (["--batch", "4"], "cache", "appended")])  # the source's caches: appended
def test_bad_batch_flags_exit_2_naming_the_field(pair_root, tmp_path, command, args, field,
                                                 value):
    result = cli(command, pair_root, tmp_path / "out", *args)
    assert result.exit_code == 2, result.output
    assert "ExportError" in result.stderr and field in result.stderr and value in result.stderr
    assert "remedy" in result.stderr or "--" in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_scale_target_batch_writes_the_batched_pass(pair_root, tmp_path):
    out = tmp_path / "scaled"
    result = cli("scale-target", pair_root, out, "--params", "1K", "--layers", 3,
                 "--intermediate", 48, "--cache", "static", "--batch", 4,
                 "--check-tokens", 6)
    assert result.exit_code == 0, result.output
    assert inspected_batch(out) == ROWS
    assert json.loads((out / "cost_scale.json").read_text())["batch"] == 4
    assert max(batched_against_alone(out, BLOCKS)) < 1e-5
