"""The bench's parts on literal inputs: spreads, prompt files, the invoke clock."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import speculant
from builders import encode
from speculant.errors import RequestError
from speculant_bench import report as reports
from speculant_bench.prompts import find_prompt_file, fit_prompts, read_prompts
from speculant_bench.spread import Spread
from speculant_bench.timing import InvokeClock


def test_spread_of_literal_values():
    spread = Spread.of([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (spread.median, spread.q1, spread.q3, spread.min, spread.max) == (3, 2, 4, 1, 5)
    assert spread.values == (4.0, 1.0, 3.0, 2.0, 5.0)  # run order kept
    assert Spread.of([2.0]).median == 2.0
    assert spread.scaled(10).median == 30
    with pytest.raises(ValueError):
        Spread.of([])


def test_prompt_file_precedence(tmp_path):
    package = tmp_path / "pair"
    package.mkdir()
    assert find_prompt_file(package, None) is None  # the bundled set
    (tmp_path / "val_prompts.json").write_text("[]")
    assert find_prompt_file(package, None) == tmp_path / "val_prompts.json"
    (package / "val_prompts.json").write_text("[]")
    assert find_prompt_file(package, None) == package / "val_prompts.json"
    chosen = tmp_path / "mine.json"
    assert find_prompt_file(package, chosen) == chosen


def test_prompts_are_token_ids_or_text(tmp_path, pair_path):
    tokenizer = speculant.load(pair_path).tokenizer
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps([[3, 4, 5], "def f"]))
    source, prompts = read_prompts(path, tokenizer)
    assert source == str(path) and prompts == [[3, 4, 5], encode("def f")]
    source, prompts = read_prompts(None, tokenizer)
    assert source.startswith("bundled") and len(prompts) >= 4 and all(prompts)


def test_prompts_under_a_prompts_key(tmp_path, pair_path):
    """The demo pair's val_prompts.json: {"prompts": [{"prompt": ids, ...}, ...]}."""
    tokenizer = speculant.load(pair_path).tokenizer
    path = tmp_path / "val_prompts.json"
    path.write_text(json.dumps({"description": "x", "prompts": [
        {"prompt": [3, 4], "continuation": [5]}, [6, 7], "def f"]}))
    assert read_prompts(path, tokenizer)[1] == [[3, 4], [6, 7], encode("def f")]
    path.write_text(json.dumps({"prompts": [{"prompt": [1]}, {"prompt": []}]}))
    with pytest.raises(RequestError, match=r"\.prompts\[1\]"):
        read_prompts(path, tokenizer)
    path.write_text(json.dumps({"prompts": []}))
    with pytest.raises(RequestError, match="non-empty JSON list"):
        read_prompts(path, tokenizer)


@pytest.mark.parametrize("content, words", [
    ("{", ["not JSON"]),
    ("[]", ["non-empty JSON list"]),
    ('{"a": 1}', ["non-empty JSON list"]),
    ('[[1, 2], [1.5]]', ["[1]", "list of token ids or a string"]),
    ('[[1], []]', ["[1]", "empty"]),
])
def test_bad_prompt_files_name_the_file_and_item(tmp_path, pair_path, content, words):
    path = tmp_path / "prompts.json"
    path.write_text(content)
    with pytest.raises(RequestError) as caught:
        read_prompts(path, speculant.load(pair_path).tokenizer)
    for word in [str(path), *words]:
        assert word in str(caught.value)


def test_prompts_keep_their_newest_tokens():
    fitted = fit_prompts("x", [[1, 2, 3, 4, 5], [6, 7]], new_tokens=6, context_cap=9)
    assert fitted.prompts == ((3, 4, 5), (6, 7)) and fitted.num_truncated == 1
    assert fitted.new_tokens == (6, 6)  # every runner decodes 6 tokens of each
    assert fit_prompts("x", [[1, 2, 3]], 100, None).prompts == ((1, 2, 3),)
    with pytest.raises(RequestError, match="no room"):
        fit_prompts("x", [[1]], new_tokens=9, context_cap=9)


def test_invoke_clock_counts_every_invoke_and_restores(pair_path):
    engine = speculant.load(pair_path)
    before = {name: list(s.observers) for name, s in engine.sessions.items()}  # the engine's
    with InvokeClock(engine) as clock:
        greedy = engine.generate(encode("def "), 12, stop_on_eos=False)
        assert len(clock.calls["target"]) == greedy.stats.target_passes
        assert clock.calls["assistant"] == [] and clock.proposer_s() == 0
        clock.reset()
        spec = engine.generate(encode("def "), 12, speculative=True, k=2, stop_on_eos=False)
        assert len(clock.calls["target"]) == spec.stats.target_passes
        assert len(clock.calls["assistant"]) == spec.stats.proposer_invocations > 0
        assert 0 < clock.target_s(skip_first=1) < clock.target_s()
    assert {name: s.observers for name, s in engine.sessions.items()} == before  # removed
    assert all("invoke" not in vars(s) for s in engine.sessions.values())  # nothing patched


def test_the_report_names_the_commit_of_the_checkout_it_runs_from():
    checkout = Path(reports.__file__).resolve().parents[2]
    if shutil.which("git") is None or not (checkout / ".git").exists():
        pytest.skip("speculant_bench is not installed from a git checkout here")
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    assert reports.versions()["source"]["commit"] == head
