"""The ``train-drafter`` command where PyTorch is absent: a typed error that names it and
says how to install it (this test needs no PyTorch)."""

from __future__ import annotations

import importlib.util

from typer.testing import CliRunner

from speculant.cli import full_app


def test_without_torch_the_command_says_how_to_install_it(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "torch" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    result = CliRunner().invoke(full_app(), ["train-drafter", "smollm2", str(tmp_path / "out"),
                                             "--device", "cpu"])
    assert result.exit_code != 0
    assert "PyTorch is not installed" in result.output and "speculant[train]" in result.output
    assert not (tmp_path / "out").exists()
