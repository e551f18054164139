"""Fixture packages for the CLI tests, written once per session, and a runner.

``cli(*args)`` invokes ``speculant.cli.app`` with stdout and stderr kept apart (click >= 8.2
always separates them: ``result.stdout``, ``result.stderr``; ``result.output`` interleaves).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

import speculant
from builders.writers import write_chained_package, write_decoder_package
from speculant.cli import full_app

app = full_app()



@pytest.fixture(scope="session")
def decoder_path(tmp_path_factory) -> Path:
    return write_decoder_package(tmp_path_factory.mktemp("cli") / "decoder")


@pytest.fixture(scope="session")
def chained_path(tmp_path_factory) -> Path:
    return write_chained_package(tmp_path_factory.mktemp("cli") / "chained")


@pytest.fixture(scope="session")
def engines() -> Callable[[Path], speculant.Engine]:
    """The same packages through the Python API, to compare the CLI with."""
    loaded: dict[Path, speculant.Engine] = {}

    def get(path: Path) -> speculant.Engine:
        if path not in loaded:
            loaded[path] = speculant.load(path)
        return loaded[path]
    return get


@pytest.fixture(scope="session")
def cli() -> Callable[..., Result]:
    runner = CliRunner()

    def invoke(*args: object) -> Result:
        return runner.invoke(app, [str(a) for a in args])
    return invoke

