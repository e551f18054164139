"""`speculant convert` and `speculant export-hf`: small commands over speculant_tools.export; typed
errors exit 2 without a traceback."""

from __future__ import annotations

import importlib.util

import numpy as np
from typer.testing import CliRunner

import speculant
from speculant.cli import full_app
from speculant_tools.export import read_weights

app = full_app()


runner = CliRunner()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_convert_writes_a_float16_package_that_runs(pair_root, tmp_path):
    result = cli("convert", pair_root, tmp_path / "fp16")
    assert result.exit_code == 0, result.output
    _, target, _ = read_weights(tmp_path / "fp16")
    assert target["model.embed_tokens.weight"].dtype == np.float16
    engine = speculant.load(tmp_path / "fp16")
    prompt = [7, 3, 41]
    assert engine.generate(prompt, 6, speculative=True, k=4).token_ids == \
        engine.generate(prompt, 6).token_ids


def test_convert_with_a_bad_dtype_exits_2(pair_root, tmp_path):
    result = cli("convert", pair_root, tmp_path / "out", "--dtype", "int8")
    assert result.exit_code == 2
    assert "ExportError" in result.stderr and "dtype" in result.stderr
    assert "Traceback" not in result.output


def test_convert_of_a_folder_without_a_package_exits_2(tmp_path):
    result = cli("convert", tmp_path, tmp_path / "out")
    assert result.exit_code == 2 and "MetadataError" in result.stderr


def test_export_hf_writes_the_checkpoint_or_names_the_missing_package(pair_root, tmp_path):
    result = cli("export-hf", pair_root, tmp_path / "hf")
    if importlib.util.find_spec("safetensors") is None:
        assert result.exit_code == 2 and "safetensors" in result.stderr
    else:
        assert result.exit_code == 0, result.output
        assert (tmp_path / "hf" / "model.safetensors").is_file()
        assert (tmp_path / "hf" / "config.json").is_file()
