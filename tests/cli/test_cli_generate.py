"""`speculant generate`: text on stdout, a summary line on stderr, `--stats` figures, and
errors as one message with exit status 2 and no traceback."""

from __future__ import annotations

import re

import pytest

import speculant.cli as cli_module

SUMMARY = re.compile(r"(?P<n>\d+) tokens in (?P<s>[\d.]+) s \((?P<rate>[\d.]+|inf) tok/s, "
                     r"admission to last token, load excluded\), "
                     r"time to first token (?P<ttft>[\d.]+) ms, stop: (?P<stop>\w+)")


def flat(text: str) -> str:
    """Every run of whitespace made one space: rich wraps stderr at the console width."""
    return " ".join(text.split())


def summary(result) -> re.Match:
    match = SUMMARY.search(flat(result.stderr))
    assert match, result.stderr
    return match


def assert_clean_failure(result, *words: str) -> str:
    """Exit status 2, one error line naming ``words``, no traceback anywhere."""
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert isinstance(result.exception, SystemExit)  # typer.Exit, not an escaped exception
    assert "Traceback" not in result.output
    message = flat(result.stderr)
    assert re.match(r"^\w+Error: ", message), message
    assert message.count("Error: ") == 1, message
    for word in words:
        assert word in message, (word, message)
    return message


# -- text and summary ---------------------------------------------------------------------------
def test_generate_prints_text_and_a_summary(cli, decoder_path):
    result = cli("generate", decoder_path, "--prompt", "def ", "--max-new-tokens", "10")
    assert result.exit_code == 0, result.output
    assert result.stdout == "tgn\neusrgl\n"  # the fixture's 10 tokens; the prompt is not echoed
    match = summary(result)
    assert match["n"] == "10" and match["stop"] == "max_new_tokens"
    assert float(match["s"]) > 0 and float(match["ttft"]) >= 0
    assert "tgn" not in result.stderr  # the text goes to stdout only
    assert "tokens in" not in result.stdout  # the summary goes to stderr only


@pytest.mark.parametrize("prompt, budget", [("def ", 30), ("a", 60), ("hello world", 5)])
def test_generate_text_equals_the_api(cli, decoder_path, engines, prompt, budget):
    expected = engines(decoder_path).generate(prompt, budget)
    result = cli("generate", decoder_path, "--prompt", prompt, "--max-new-tokens", budget)
    assert result.exit_code == 0, result.output
    assert result.stdout == expected.text + "\n"
    match = summary(result)
    assert int(match["n"]) == len(expected.token_ids)
    assert match["stop"] == expected.stats.stop_reason


def test_generate_stop_string(cli, decoder_path, engines):
    expected = engines(decoder_path).generate("def ", 30, stop=["gn"])
    result = cli("generate", decoder_path, "--prompt", "def ", "--max-new-tokens", 30,
                 "--stop", "gn")
    assert result.exit_code == 0, result.output
    assert result.stdout == expected.text + "\n"
    assert not result.stdout.rstrip("\n").endswith("gn")  # the stop text is not written
    assert expected.text + "gn" == expected_tokens_text(engines(decoder_path), expected)
    assert summary(result)["stop"] == "stop_string"


def test_summary_is_one_line_at_the_default_width(cli, decoder_path, monkeypatch):
    """Rich renders stderr at 80 columns when it is not a terminal (a file, a pipe): the
    summary must still be one line a script can read."""
    monkeypatch.setattr(cli_module.stderr, "_width", 80)
    result = cli("generate", decoder_path, "--prompt", "def ", "--max-new-tokens", "10")
    lines = [line for line in result.stderr.splitlines() if "tok/s" in line]
    assert len(lines) == 1 and SUMMARY.search(lines[0]), result.stderr


# -- speculative with --stats -------------------------------------------------------------------
def counters(stderr: str) -> dict[str, str]:
    return dict(re.findall(r"│ (\w+)\s+│ (\S+)\s+│", stderr))


@pytest.mark.parametrize("k", [1, 4])
def test_generate_speculative_stats(cli, chained_path, engines, k):
    engine = engines(chained_path)
    expected = engine.generate("def ", 40, speculative=True, k=k)
    assert expected.token_ids == engine.generate("def ", 40).token_ids
    result = cli("generate", chained_path, "--prompt", "def ", "--max-new-tokens", 40,
                 "--speculative", "--k", k, "--stats")
    assert result.exit_code == 0, result.output
    assert result.stdout == expected.text + "\n"
    stats, text = expected.stats, flat(result.stderr)
    assert f"mean accepted length: {stats.mean_accepted_length:.3f}" in text
    by_position = "  ".join(f"{i + 1}:{rate:.2f}"
                            for i, rate in enumerate(stats.acceptance_by_position))
    assert len(stats.acceptance_by_position) == k
    assert f"acceptance by position: {flat(by_position)}" in text
    assert stats.cpu_pool and f"CPU thread pool: {flat(stats.cpu_pool)}" in text
    rows = counters(result.stderr)
    for name in ("rounds", "greedy_steps", "target_passes", "drafts_proposed",
                 "accepted_drafts", "rejected_drafts", "full_accepts", "rollbacks",
                 "rolled_back_positions", "proposer_invocations", "committed"):
        assert rows.get(name) == str(getattr(stats, name)), (name, rows)
    assert rows["stop_reason"] == stats.stop_reason
    assert int(rows["rounds"]) > 0


def test_generate_speculative_with_k_4_uses_that_width(cli, chained_path, engines):
    expected = engines(chained_path).generate("def ", 20, speculative=True, k=4)
    result = cli("generate", chained_path, "--prompt", "def ", "--max-new-tokens", 20,
                 "--speculative", "--k", 4, "--stats")
    assert result.exit_code == 0, result.output
    assert f"mean accepted length: {expected.stats.mean_accepted_length:.3f}" in \
        flat(result.stderr)
    assert "acceptance by position: 1:" in flat(result.stderr)
    assert "4:" in flat(result.stderr).split("acceptance by position:")[1].split("counters")[0]


def test_generate_speculative_without_k_picks_k_per_round(cli, chained_path, engines):
    """No --k: k="auto", widths within max_proposal_width (4), the text still greedy's; the
    stats show the widths the rounds ran at and the CUDA-graph state (eager on the CPU)."""
    greedy = engines(chained_path).generate("def ", 20)
    result = cli("generate", chained_path, "--prompt", "def ", "--max-new-tokens", 20,
                 "--speculative", "--stats")
    assert result.exit_code == 0, result.output
    assert result.stdout == greedy.text + "\n"
    text = flat(result.stderr)
    rounds = re.search(r"rounds by width: ((?:k=\d+:\d+\s*)+)", text)
    assert rounds is not None, text
    widths = {int(k): int(n) for k, n in re.findall(r"k=(\d+):(\d+)", rounds.group(1))}
    rows = counters(result.stderr)
    assert max(widths) <= 4 and sum(widths.values()) == int(rows["rounds"])
    assert "cuda graphs: target: eager (the device is the CPU); assistant: eager (the " \
           "device is the CPU)" in text
    assert rows["graph_captures"] == rows["graph_replays"] == "0"
    # the host reads each pass before the next (nothing queued on a CPU), and says so
    assert "queued ahead of the host: none (each pass read before the next)" in text
    assert rows["queued_passes"] == "0"


def test_generate_stats_without_speculation(cli, decoder_path):
    result = cli("generate", decoder_path, "--max-new-tokens", 5, "--stats")
    assert result.exit_code == 0, result.output
    assert "mean accepted length: n/a" in flat(result.stderr)
    rows = counters(result.stderr)
    assert rows["rounds"] == "0" and rows["greedy_steps"] == "4" and rows["target_passes"] == "5"


# -- errors ---------------------------------------------------------------------------------------
def test_bad_package_path(cli, tmp_path):
    result = cli("generate", tmp_path / "missing", "--prompt", "def ")
    assert_clean_failure(result, "MetadataError", "missing")


def test_folder_without_metadata(cli, tmp_path):
    assert_clean_failure(cli("generate", tmp_path), "inference_metadata")


def test_k_above_the_proposal_width(cli, chained_path):
    result = cli("generate", chained_path, "--speculative", "--k", 9)
    assert_clean_failure(result, "RequestError", "max_proposal_width", "9")


def test_k_zero(cli, chained_path):
    assert_clean_failure(cli("generate", chained_path, "--speculative", "--k", 0),
                         "RequestError", "k")


@pytest.mark.parametrize("k", [[], ["--k", "2"]], ids=["no-k", "k=2"])
def test_speculating_without_a_speculative_contract(cli, decoder_path, k):
    result = cli("generate", decoder_path, "--speculative", *k)
    assert_clean_failure(result, "RequestError", "speculative")


def test_max_new_tokens_zero(cli, decoder_path):
    assert_clean_failure(cli("generate", decoder_path, "--max-new-tokens", 0),
                         "RequestError", "max_new_tokens")


def test_unknown_device(cli, decoder_path):
    assert_clean_failure(cli("generate", decoder_path, "--device", "tpu"), "device", "tpu")


def test_empty_prompt(cli, decoder_path):
    assert_clean_failure(cli("generate", decoder_path, "--prompt", ""), "prompt")


def test_error_message_keeps_bracketed_text(cli, tmp_path):
    result = cli("generate", tmp_path / "[v1]" / "pkg")
    assert_clean_failure(result, "MetadataError", "[v1]/pkg")


def test_error_message_with_a_closing_tag_lookalike(cli, tmp_path):
    result = cli("generate", tmp_path / "a[" / "b]")
    assert_clean_failure(result, "MetadataError", "a[/b]")


def test_a_refused_request_writes_nothing_to_stdout(cli, chained_path):
    result = cli("generate", chained_path, "--prompt", "def ", "--speculative", "--k", 9)
    assert result.exit_code == 2
    assert result.stdout == ""


# -- the bundled demo package ---------------------------------------------------------------------
def test_generate_runs_the_demo_by_name(cli):
    result = cli("generate", "demo", "--prompt", "def ", "--max-new-tokens", 8)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip()  # the default prompt's continuation
    assert summary(result)["n"] == "8"
    speculative = cli("generate", "demo", "--prompt", "def ", "--max-new-tokens", 8,
                      "--speculative", "--stats")
    if speculative.exit_code == 0:  # the demo may or may not declare a chained proposer
        assert speculative.stdout == result.stdout
        assert "mean accepted length" in flat(speculative.stderr)
    else:
        assert_clean_failure(speculative, "speculative")


def expected_tokens_text(engine, generation) -> str:
    return engine.tokenizer.decode(generation.token_ids)


# -- issue 13 item 6: --echo, --prompt -, --json, --version, --min-p, --threads ------------------
def test_echo_writes_the_prompt_first(cli, decoder_path, engines):
    expected = engines(decoder_path).generate("def ", 10)
    result = cli("generate", decoder_path, "--prompt", "def ", "--max-new-tokens", 10, "--echo")
    assert result.exit_code == 0, result.output
    assert result.stdout == "def " + expected.text + "\n"


def test_prompt_from_standard_input(decoder_path, engines):
    from typer.testing import CliRunner

    from speculant.cli import full_app

    expected = engines(decoder_path).generate("hello world", 12)
    result = CliRunner().invoke(full_app(), ["generate", str(decoder_path), "--prompt", "-",
                                             "--max-new-tokens", "12"], input="hello world")
    assert result.exit_code == 0, result.output
    assert result.stdout == expected.text + "\n"


def test_json_has_text_token_ids_and_stats(cli, chained_path, engines):
    import json

    from speculant.cli import DEFAULT_PROMPT

    expected = engines(chained_path).generate(DEFAULT_PROMPT, 20, proposer="chained", k=2)
    result = cli("generate", chained_path, "--max-new-tokens", 20, "--proposer", "chained",
                 "--k", 2, "--json", "--threads", 1, "--min-p", 0.0)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["text"] == expected.text and data["token_ids"] == expected.token_ids
    assert data["finish_reason"] == expected.finish_reason
    assert data["stats"]["trace"] == [list(pair) for pair in expected.stats.trace]


def test_min_p_reaches_the_api(cli, decoder_path):
    result = cli("generate", decoder_path, "--temperature", 1, "--min-p", 1.5)
    assert_clean_failure(result, "RequestError", "min_p")


def test_version(cli):
    result = cli("--version")
    assert result.exit_code == 0 and result.stdout.startswith("speculant ")


def test_invalid_utf8_prompt_is_a_request_error(cli, decoder_path):
    """click hands undecodable argv bytes over as lone surrogates."""
    assert_clean_failure(cli("generate", decoder_path, "--prompt", "a\udcff"), "RequestError",
                         "prompt")
