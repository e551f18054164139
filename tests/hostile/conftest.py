"""Hostile input (issue 15): the package that corrupted copies start from, and a runner."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from builders.writers import write_decoder_package
from speculant.cli import full_app

app = full_app()


@pytest.fixture(scope="session")
def decoder_template(tmp_path_factory) -> Path:
    """The tiny greedy decoder package (binary .onnx) that corrupted copies start from."""
    return write_decoder_package(tmp_path_factory.mktemp("hostile") / "decoder")


@pytest.fixture
def decoder_copy(decoder_template, tmp_path) -> Callable[[], Path]:
    def copy(name: str = "") -> Path:
        name = name or f"pkg{len(list(tmp_path.glob('pkg*')))}"
        return Path(shutil.copytree(decoder_template, tmp_path / name))
    return copy


def read_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="session")
def cli() -> Callable[..., Result]:
    runner = CliRunner()

    def invoke(*args: object) -> Result:
        return runner.invoke(app, [str(a) for a in args])
    return invoke
