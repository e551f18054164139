"""One bench run of the hermetic chained fixture (k up to 8), shared by the bench tests:
through the API (``bench_run``) and through the CLI (``cli_bench``: its result and folder)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from speculant.bench import BenchConfig, run_bench
from speculant.cli import app
from speculant.fixtures.writers import write_chained_package

NEW_TOKENS = 16


@pytest.fixture(scope="session")
def pair_path(tmp_path_factory) -> Path:
    return write_chained_package(tmp_path_factory.mktemp("bench") / "pair", fmt="onnx",
                                 max_proposal_width=8, rollback_positions=8)


@pytest.fixture(scope="session")
def bench_run(pair_path):
    return run_bench(BenchConfig(pair_path, new_tokens=NEW_TOKENS, warmup=1, repeats=2,
                                 threads=1, width_repeats=3))


@pytest.fixture(scope="session")
def cli_bench(pair_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "out"
    result = CliRunner().invoke(app, ["bench", str(pair_path), "--warmup", "1", "--repeats", "2",
                                      "--new-tokens", str(NEW_TOKENS), "--threads", "1",
                                      "--out", str(out)])
    return result, out
