"""`speculant bench PACKAGE --compare LABEL=PATH`: other packages of the same model timed in
the same run, their runners interleaved with the package's, on the hermetic chained fixture.

Nothing here asserts a timing: only that the figures are there and agree with each other.
"""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from builders import encode
from speculant.cli import full_app
from speculant.errors import RequestError
from speculant_bench import BenchConfig, run_bench
from speculant_bench.compared import parse_compared

app = full_app()


def test_a_compared_package_is_labelled_by_its_label_or_its_folder():
    assert parse_compared(["int4=/tmp/a/int4", "/tmp/b/v5", "smollm2"]) == [
        ("int4", "/tmp/a/int4"), ("v5", "/tmp/b/v5"), ("smollm2", "smollm2")]
    with pytest.raises(ValueError, match="labelled 'v5'"):
        parse_compared(["/tmp/a/v5", "/tmp/b/v5"])
    with pytest.raises(ValueError, match="names no package"):
        parse_compared(["int4="])


@pytest.fixture(scope="module")
def twin(pair_path, tmp_path_factory):
    """The same pair in another folder: the same tokenizer, the same tokens."""
    folder = tmp_path_factory.mktemp("compared") / "twin"
    shutil.copytree(pair_path, folder)
    return folder


def test_compared_runners_are_timed_beside_the_packages_and_reported(pair_path, twin,
                                                                     tmp_path):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([encode("def f(x):\n"), encode("for x in y:\n")]))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [
        "bench", str(pair_path), "--compare", f"twin={twin}", "--prompts", str(prompts),
        "--proposer", "chained", "--k", "2", "--new-tokens", "8", "--warmup", "0",
        "--repeats", "2", "--threads", "1", "--width-repeats", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "bench.json").read_text())
    assert [r["name"] for r in report["runners"]] == ["greedy", "chained k=2"]
    [package] = report["compared"]
    assert package["label"] == "twin" and package["path"] == str(twin)
    names = [r["name"] for r in package["runners"]]
    assert names == ["twin: greedy", "twin: chained k=2"]
    greedy, chained = package["runners"]
    assert greedy["speedup_decode"] == 1.0 and greedy["matches_greedy"] is None
    assert chained["matches_greedy"] is True
    for record in package["runners"]:
        assert record["matches_package_greedy"] is True  # the same weights
        assert record["over_package_decode"] > 0
        assert len(record["over_package_decode_per_repeat"]["values"]) == 2
        assert record["decoded_every_token"]
    mine = next(r for r in report["runners"] if r["name"] == "chained k=2")
    assert chained["mean_accepted_length"] == mine["mean_accepted_length"]
    text = (out / "bench.md").read_text()
    assert "## Compared packages" in text and "| twin: chained k=2 |" in text


def test_a_package_with_another_tokenizer_is_refused(pair_path, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(pair_path, other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["A"] = vocab.pop("a")  # one token spelled differently
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(RequestError, match="share the package's tokenizer") as error:
        run_bench(BenchConfig(pair_path, compare=(("other", str(other)),), new_tokens=4,
                              warmup=0, repeats=2, threads=1, proposers=(), width_repeats=2))
    assert error.value.problems[0].file == str(other)


def test_the_cli_refuses_two_compared_packages_with_one_label():
    result = CliRunner().invoke(app, ["bench", "--compare", "a=x", "--compare", "a=y"])
    assert result.exit_code == 2 and "--compare" in result.output and "label" in result.output


def test_spec_bench_rows_hold_each_compared_runner_over_its_own_greedy(pair_path, twin):
    from speculant_bench.report import summarize

    run = run_bench(BenchConfig(pair_path, compare=(("twin", str(twin)),), new_tokens=6,
                                warmup=0, repeats=2, threads=1, proposers=("prompt_lookup",),
                                ks=(2,), width_repeats=2, spec_bench=True, per_category=1))
    rows = summarize(run, "speculant bench --spec-bench --compare")["spec_bench"]["rows"]
    overall = [r for r in rows if r["category"] == "overall"]
    assert [r["runner"] for r in overall] == ["greedy", "prompt_lookup k=2", "twin: greedy",
                                              "twin: prompt_lookup k=2"]
    assert overall[2]["speedup_decode"] == 1.0
    assert overall[3]["matches_greedy"] is True
    assert overall[3]["mean_accepted_length"] == overall[1]["mean_accepted_length"]
