"""A package in circulation (`sequence` on every sequence-like axis) is refused; after
`speculant metadata name-axes` it loads, validates and its chain runs (issue: axis naming)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import speculant
from builders import definition as fx
from builders.trace import greedy_stream
from builders.writers import write_chained_package
from speculant.cli import full_app
from speculant.errors import UnsupportedError

app = full_app()



def test_renamed_package_runs_the_chain(tmp_path):
    root = write_chained_package(tmp_path / "pair", variant="in_circulation")
    with pytest.raises(UnsupportedError) as refused:
        speculant.load(root)
    assert "name-axes" in str(refused.value)

    result = CliRunner().invoke(app, ["metadata", "name-axes", str(root)])
    assert result.exit_code == 0, result.stderr
    assert "kv_sequence" in result.stderr

    engine = speculant.load(root)
    run = engine.generate([5, 9, 3], 40, speculative=True, k=4)
    assert run.token_ids == greedy_stream(fx.make_spec(), [5, 9, 3], 40)
    assert run.stats.rounds_with_first_draft_accepted * 4 >= run.stats.rounds
    # The document written back validates like a hand-named one: same plan symbols.
    chain = engine.package.plan.chain
    assert (chain.position_symbol, chain.kv_symbol) == ("sequence", "kv_sequence")
