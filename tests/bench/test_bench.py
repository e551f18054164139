"""`speculant bench` on the hermetic chained fixture: what it decodes, what it writes.

Speed is measured, not tested: nothing here asserts a timing, only that timings are there.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from rich.console import Console

import speculant
from speculant_bench.command import write_report
from speculant_bench.report import PNG_FILES
from speculant_bench.runners import Runner, why_unavailable

NEW_TOKENS = 16  # the runs of conftest.py

SPREAD = {"type": "object", "required": ["median", "q1", "q3", "min", "max", "values"],
          "properties": {"values": {"type": "array", "minItems": 2,
                                    "items": {"type": "number"}},
                         "median": {"type": "number", "exclusiveMinimum": 0}}}
SPLIT = {"type": "object", "required": ["proposer", "target", "other", "total"],
         "additionalProperties": {"type": "object", "required": ["median", "values"]}}
RUNNER = {
    "type": "object",
    "required": ["name", "proposer", "k", "decode_tokens_per_s", "end_to_end_tokens_per_s",
                 "time_to_first_token_ms", "round_ms", "tokens_per_prompt",
                 "decoded_every_token", "target_passes", "rounds", "greedy_steps",
                 "proposer_invocations", "mean_accepted_length", "acceptance_by_position",
                 "matches_greedy", "prompts_differing_from_greedy", "speedup_decode",
                 "speedup_end_to_end"],
    "properties": {"decode_tokens_per_s": SPREAD, "end_to_end_tokens_per_s": SPREAD,
                   "time_to_first_token_ms": SPREAD, "round_ms": SPLIT,
                   "acceptance_by_position": {"type": "array",
                                              "items": {"type": "number", "minimum": 0,
                                                        "maximum": 1}}},
}
REPORT = {
    "type": "object",
    "required": ["schema", "date", "command", "machine", "versions", "package", "config",
                 "prompts", "runners", "skipped", "verify_width"],
    "properties": {
        "schema": {"const": "speculant_bench/1"},
        "machine": {"type": "object", "required": ["cpu", "cores", "gpu", "load_average"]},
        "versions": {"type": "object", "required": ["python", "speculant", "onnxruntime"]},
        "config": {"type": "object", "required": ["device", "threads", "new_tokens", "warmup",
                                                  "repeats", "proposers", "k"]},
        "runners": {"type": "array", "minItems": 5, "items": RUNNER},
        "skipped": {"type": "array", "items": {"type": "object",
                                               "required": ["name", "reason"]}},
        "verify_width": {
            "type": "object", "required": ["cache_length", "widths"],
            "properties": {"widths": {"type": "array", "minItems": 5, "items": {
                "type": "object",
                "required": ["width", "pass_ms", "invoke_ms", "bare_run_ms", "ratio"]}}}},
        "runtime_overhead": {"type": "object",
                             "required": ["greedy_ms_per_token", "bare_run_ms", "share"]},
    },
}


@pytest.fixture(scope="module")
def report(cli_bench) -> dict:
    result, out = cli_bench
    assert result.exit_code == 0, result.output
    return json.loads((out / "bench.json").read_text())


def test_the_cli_writes_every_file(cli_bench):
    result, out = cli_bench
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(["bench.json", "bench.md",
                                                            *PNG_FILES])
    assert result.stdout == (out / "bench.md").read_text()  # the table goes to stdout too


def test_report_matches_the_schema(report):
    jsonschema.validate(report, REPORT)
    assert report["config"] | {"new_tokens": NEW_TOKENS, "warmup": 1, "repeats": 2,
                               "threads": 1} == report["config"]
    assert [w["width"] for w in report["verify_width"]["widths"]] == [1, 2, 3, 5, 9]
    assert report["verify_width"]["widths"][0]["ratio"] == 1.0


def test_the_bare_run_and_the_runtime_overhead(report):
    """ORT's bare run of a pass is part of that pass (never longer than it, by more than the
    two timings' noise), and the overhead line is greedy's time per token against it."""
    for width in report["verify_width"]["widths"]:
        bare, whole = width["bare_run_ms"]["median"], width["pass_ms"]["median"]
        assert 0 < bare < 1.5 * whole, width
    overhead = report["runtime_overhead"]
    greedy = report["runners"][0]["decode_tokens_per_s"]["median"]
    assert overhead["greedy_ms_per_token"] == pytest.approx(1000 / greedy)
    assert overhead["bare_run_ms"] == report["verify_width"]["widths"][0]["bare_run_ms"]["median"]
    assert overhead["share"] == pytest.approx(
        1 - overhead["bare_run_ms"] / overhead["greedy_ms_per_token"])


def test_greedy_and_every_proposer_at_every_k_ran(report):
    names = [r["name"] for r in report["runners"]]
    assert names == ["greedy", *(f"{p} k={k}" for p in ("chained", "draft", "prompt_lookup",
                                                         "lookup_chained")
                                 for k in (1, 2, 4, 8, "auto"))]
    assert report["skipped"] == []
    assert report["prompts"]["count"] == 3 and report["prompts"]["source"].endswith(".json")


def test_every_runner_decoded_exactly_n_tokens(report):
    for runner in report["runners"]:
        assert runner["decoded_every_token"], runner["name"]
        assert runner["tokens_per_prompt"] == [NEW_TOKENS] * report["prompts"]["count"]


def test_speculative_runners_equal_greedy(report, bench_run, pair_path):
    for runner in report["runners"][1:]:
        assert runner["matches_greedy"] is True, runner["name"]
    engine = speculant.load(pair_path)
    greedy = [engine.generate(list(p), NEW_TOKENS, stop_on_eos=False).token_ids
              for p in bench_run.prompts.prompts]
    for result in bench_run.results:
        for samples in result.samples:
            assert [s.token_ids for s in samples] == greedy, result.runner.name


def test_speculative_figures_are_the_decode_stats(report):
    for runner in report["runners"][1:]:
        assert runner["target_passes"] == report["prompts"]["count"] + runner["rounds"] + \
            runner["greedy_steps"]
        if runner["proposer"] == "prompt_lookup":  # no ONNX session: its time is "other"
            assert runner["round_ms"]["proposer"]["median"] == 0
            continue
        assert runner["rounds"] > 0 and runner["proposer_invocations"] > 0
        widest = runner["k"] if runner["k"] != "auto" else 8  # auto: within the kind's bound
        if runner["k"] == "auto":
            assert 1 <= len(runner["acceptance_by_position"]) <= widest
        else:
            assert len(runner["acceptance_by_position"]) == runner["k"]
        assert 1 <= runner["mean_accepted_length"] <= widest + 1
        assert runner["round_ms"]["proposer"]["median"] > 0  # chained and draft sessions
    greedy = report["runners"][0]
    assert greedy["rounds"] == 0 and greedy["round_ms"]["proposer"]["median"] == 0
    assert greedy["speedup_decode"] == 1.0 and greedy["matches_greedy"] is None


def test_markdown_lists_each_runner(cli_bench, report):
    _, out = cli_bench
    text = (out / "bench.md").read_text()
    for runner in report["runners"]:
        assert f"| {runner['name']} |" in text
    assert "Verify-width cost curve" in text and report["command"] in text


def test_pngs_are_written(cli_bench):
    _, out = cli_bench
    for name in PNG_FILES:
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


def test_without_matplotlib_the_plots_are_skipped(report, tmp_path, monkeypatch):
    for module in ("matplotlib", "matplotlib.pyplot"):
        monkeypatch.setitem(__import__("sys").modules, module, None)  # import raises
    console = Console(record=True, width=200)
    written = write_report(report, tmp_path, console)
    assert written == ["bench.json", "bench.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.md"]
    assert "matplotlib is not installed" in console.export_text()


def test_unavailable_runners_give_the_engine_reason(pair_path, bench_run):
    engine = bench_run.engine
    prompt = bench_run.prompts.prompts[0]
    assert why_unavailable(engine, Runner(), prompt) is None
    assert why_unavailable(engine, Runner("chained", 8), prompt) is None
    assert "max_proposal_width" in why_unavailable(engine, Runner("chained", 9), prompt)
    assert "unknown proposer" in why_unavailable(engine, Runner("no_such_proposer", 1),
                                                 prompt)
    without_draft = speculant.load(pair_path)
    assert "draft" in why_unavailable(without_draft, Runner("draft", 1), prompt)


def test_the_bundled_prompts_and_every_runner_through_the_api(bench_run):
    assert bench_run.prompts.source.startswith("bundled") and len(bench_run.prompts.prompts) == 8
    assert [r.runner.name for r in bench_run.results][:2] == ["greedy", "chained k=1"]
    assert len(bench_run.results) == 1 + 4 * 5 and bench_run.skipped == []  # k 1 2 4 8 auto


def test_the_table_shows_the_bare_run_and_the_overhead(cli_bench):
    _, out = cli_bench
    text = (out / "bench.md").read_text()
    assert "| bare ORT run ms | runtime's share |" in text
    assert "Runtime overhead per greedy pass: greedy decodes a token in" in text
