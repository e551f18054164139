"""One bench run of the hermetic chained fixture (k up to 8) with a draft model, shared by the
bench tests: through the API over the bundled prompts (``bench_run``) and through the CLI over
a prompt file (``cli_bench``: its result and folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from builders import encode
from builders.writers import write_chained_package, write_decoder_package
from speculant.cli import full_app
from speculant_bench import BenchConfig, run_bench

app = full_app()

NEW_TOKENS = 16
CLI_PROMPTS = ["def fib(n):\n", "for x in items:\n", "print(hello world)"]


@pytest.fixture(scope="session")
def pair_path(tmp_path_factory) -> Path:
    return write_chained_package(tmp_path_factory.mktemp("bench") / "pair", fmt="onnx",
                                 max_proposal_width=8, rollback_positions=8)


@pytest.fixture(scope="session")
def draft_path(tmp_path_factory) -> Path:
    """A draft model that disagrees with the target now and then (its own deviations)."""
    return write_decoder_package(tmp_path_factory.mktemp("bench") / "draft",
                                 rollback_positions=8, deviation_positions={3, 9, 20, 33})


@pytest.fixture(scope="session")
def bench_run(pair_path, draft_path):
    return run_bench(BenchConfig(pair_path, draft=draft_path, new_tokens=NEW_TOKENS, warmup=1,
                                 repeats=2, threads=1, width_repeats=3))


@pytest.fixture(scope="session")
def cli_bench(pair_path, draft_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    prompts = folder / "prompts.json"
    prompts.write_text(json.dumps([encode(p) for p in CLI_PROMPTS]))
    out = folder / "out"
    result = CliRunner().invoke(app, ["bench", str(pair_path), "--draft", str(draft_path),
                                      "--prompts", str(prompts), "--warmup", "1",
                                      "--repeats", "2", "--new-tokens", str(NEW_TOKENS),
                                      "--threads", "1", "--out", str(out)])
    return result, out
