"""`speculant bench --spec-bench`: the vendored questions, their checks, their selection, and a
per-category table whose accounting adds up, on the hermetic chained fixture.

Nothing here asserts a timing: only that the figures are there and agree with each other.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from builders.writers import write_chained_package
from speculant.cli import full_app
from speculant.engine import load
from speculant.errors import RequestError
from speculant_bench import BenchConfig, run_bench
from speculant_bench.report import markdown, summarize
from speculant_bench.spec_bench import prompts as spec_prompts
from speculant_bench.spec_bench.questions import (
    MT_BENCH,
    MT_BENCH_SUBCATEGORIES,
    categories,
    read_questions,
    select_questions,
)
from speculant_bench.spec_bench.report import OVERALL

app = full_app()

MAX_NEW_TOKENS = 12
# Characters of the fixture vocabulary only; "\n" after "\n" leads the fixture to its EOS.
CHAT_TEMPLATE = ("{% for m in messages %}({{ m.role }}) {{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}(assistant) {% endif %}")
LEADERBOARD = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]
GOOD_LINE = {"question_id": 1, "category": "qa", "turns": ["What is a cache?"]}


# -- the vendored file -------------------------------------------------------------------------
def test_the_vendored_file_holds_480_first_turns_in_the_leaderboards_six_categories():
    questions = read_questions()
    assert len(questions) == 480
    assert categories(questions) == LEADERBOARD
    assert all(sum(q.category == c for q in questions) == 80 for c in LEADERBOARD)
    assert {q.subcategory for q in questions if q.category == MT_BENCH} == \
        MT_BENCH_SUBCATEGORIES
    raw = Path(__file__).parents[2] / "src/speculant_bench/spec_bench/question.jsonl"
    lines = [json.loads(line) for line in raw.read_text().splitlines()]
    assert [q.first_turn for q in questions] == [line["turns"][0] for line in lines]
    assert [q.question_id for q in questions] == [line["question_id"] for line in lines]
    assert any(len(line["turns"]) == 2 for line in lines)  # second turns exist, and are left


def test_the_licence_and_attribution_ship_beside_the_questions():
    folder = Path(__file__).parents[2] / "src/speculant_bench/spec_bench"
    assert "Apache License" in (folder / "LICENSE").read_text()
    assert "hemingkx/Spec-Bench" in (folder / "NOTICE").read_text()


@pytest.mark.parametrize(("line", "where", "says"), [
    ("{not json", "line 2", "not JSON"),
    (json.dumps([1, 2]), "line 2", "not a JSON object"),
    (json.dumps({**GOOD_LINE, "question_id": "7"}), "line 2.question_id", "integer"),
    (json.dumps({**GOOD_LINE, "question_id": True}), "line 2.question_id", "integer"),
    (json.dumps({**GOOD_LINE, "category": ""}), "line 2.category", "non-empty string"),
    (json.dumps({**GOOD_LINE, "turns": []}), "line 2.turns", "list of strings"),
    (json.dumps({**GOOD_LINE, "turns": [" ", "x"]}), "line 2.turns", "first is not empty"),
    (json.dumps({**GOOD_LINE, "turns": "a question"}), "line 2.turns", "list of strings"),
])
def test_a_malformed_line_is_refused_naming_the_file_and_the_line(tmp_path, line, where, says):
    path = tmp_path / "question.jsonl"
    path.write_text(json.dumps(GOOD_LINE) + "\n" + line + "\n")
    with pytest.raises(RequestError, match=says) as error:
        read_questions(path)
    problem = error.value.problems[0]
    assert (problem.file, problem.path) == (str(path), where)
    assert "question_id" in problem.expected


def test_an_empty_file_is_refused(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("\n")
    with pytest.raises(RequestError, match="holds no question"):
        read_questions(path)


def test_a_selection_takes_each_category_in_turn_over_its_subcategories():
    questions = read_questions()
    eight = select_questions(questions, 8)
    assert len(eight) == 8 * len(LEADERBOARD)
    assert categories(eight) == LEADERBOARD
    assert {q.subcategory for q in eight if q.category == MT_BENCH} == MT_BENCH_SUBCATEGORIES
    translation = [q for q in questions if q.category == "translation"]
    assert [q for q in eight if q.category == "translation"] == translation[:8]  # file order
    every = select_questions(questions, None)
    assert categories(every) == LEADERBOARD
    assert sorted(every, key=lambda q: q.question_id) == \
        sorted(questions, key=lambda q: q.question_id)
    assert len(select_questions(questions, 1000)) == 480
    with pytest.raises(RequestError, match="at least one question"):
        select_questions(questions, 0)


# -- prompts ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chat_pair(tmp_path_factory) -> Path:
    root = write_chained_package(tmp_path_factory.mktemp("spec_bench") / "pair", fmt="onnx",
                                 max_proposal_width=8, rollback_positions=8)
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHAT_TEMPLATE, "bos_token": "", "eos_token": "</s>"}))
    return root


@pytest.fixture(scope="module")
def plain_pair(tmp_path_factory) -> Path:
    return write_chained_package(tmp_path_factory.mktemp("spec_bench") / "plain", fmt="onnx",
                                 max_proposal_width=8, rollback_positions=8)


def test_first_turns_go_through_the_chat_template_or_are_plain_text_without_one(chat_pair,
                                                                                  plain_pair):
    questions = select_questions(read_questions(), 1)
    chat = load(chat_pair, threads=1)
    rendering, prompts = spec_prompts.first_turn_prompts(chat, questions)
    assert rendering == spec_prompts.CHAT_TEMPLATE
    assert prompts[0] == chat.tokenizer.encode(
        f"(user) {questions[0].first_turn}\n(assistant) ")
    plain = load(plain_pair, threads=1)
    rendering, prompts = spec_prompts.first_turn_prompts(plain, questions)
    assert rendering == spec_prompts.PLAIN_TEXT
    assert prompts[0] == plain.tokenizer.encode(questions[0].first_turn)
    with pytest.raises(RequestError, match="no chat template"):
        spec_prompts.first_turn_prompts(plain, questions, needs_template=True)


def test_an_answer_ends_at_the_end_of_its_turn_and_is_decoded_to_that_length(chat_pair):
    engine = load(chat_pair, threads=1)
    options = spec_prompts.answer_options(engine, 40)
    assert engine.package.plan.eos_ids[0] in options.stop_token_ids and options.stop_on_eos
    prompt = engine.tokenizer.encode(engine.render_chat([{"role": "user", "content": "ab"}]))
    [length] = spec_prompts.answer_lengths(engine, [prompt], 40)
    stopped = engine.generate(prompt, options)
    assert 1 <= length <= 40 and length == max(1, len(stopped.token_ids))
    with pytest.raises(RequestError, match="at least one new token"):
        spec_prompts.answer_lengths(engine, [prompt], 0)


# -- the table ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cli_spec_bench(chat_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("spec_bench") / "out"
    result = CliRunner().invoke(app, [
        "bench", str(chat_pair), "--spec-bench", "--per-category", "1", "--max-new-tokens",
        str(MAX_NEW_TOKENS), "--proposer", "chained", "--proposer", "prompt_lookup", "--k", "2",
        "--k", "auto", "--warmup", "0", "--repeats", "2", "--threads", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads((out / "bench.json").read_text()), (out / "bench.md").read_text()


def test_the_table_has_a_row_per_category_and_runner_and_an_overall_row(cli_spec_bench):
    report, _ = cli_spec_bench
    section = report["spec_bench"]
    names = [r["name"] for r in report["runners"]]
    assert names == ["greedy", "chained k=2", "chained k=auto", "prompt_lookup k=2",
                     "prompt_lookup k=auto"]
    assert [(r["category"], r["runner"]) for r in section["rows"]] == [
        (category, name) for category in [*LEADERBOARD, OVERALL] for name in names]
    assert section["rendering"] == spec_prompts.CHAT_TEMPLATE
    assert section["questions_in_file"] == 480 and section["per_category"] == 1
    assert [q["category"] for q in section["questions"]] == LEADERBOARD


def test_the_tables_accounting_adds_up(cli_spec_bench):
    report, _ = cli_spec_bench
    section = report["spec_bench"]
    answers = [q["answer_tokens"] for q in section["questions"]]
    assert all(1 <= n <= MAX_NEW_TOKENS for n in answers)
    assert report["prompts"]["new_tokens"] == answers
    rows = section["rows"]
    for row in rows:
        assert row["tokens"] == sum(n for q, n in zip(section["questions"], answers,
                                                      strict=True)
                                    if row["category"] in (OVERALL, q["category"]))
        assert row["decode_tokens_per_s"]["median"] >= 0
        if row["proposer"] is None:
            assert row["speedup_decode"] == row["speedup_end_to_end"] == 1.0
            assert row["mean_accepted_length"] is None and row["rounds"] == 0
            continue
        assert row["matches_greedy"] is True
        if row["rounds"]:
            first = row["first_draft_acceptance"]
            assert 0 <= first <= 1
            # a_r >= 2 exactly where the first draft was accepted, so mean a_r >= 1 + that share
            assert row["mean_accepted_length"] >= 1 + first - 1e-12
            if row["k"] != "auto":
                assert row["mean_accepted_length"] <= row["k"] + 1
    for name in {row["runner"] for row in rows}:
        mine = [row for row in rows if row["runner"] == name]
        overall, per_category = mine[-1], mine[:-1]
        assert overall["questions"] == sum(row["questions"] for row in per_category)
        assert overall["rounds"] == sum(row["rounds"] for row in per_category)
        if overall["rounds"]:
            weighted = sum(row["mean_accepted_length"] * row["rounds"]
                           for row in per_category if row["rounds"])
            assert overall["mean_accepted_length"] == pytest.approx(weighted / overall["rounds"])
    runner = next(r for r in report["runners"] if r["name"] == "chained k=2")
    overall = next(r for r in rows if r["category"] == OVERALL and r["runner"] == "chained k=2")
    assert overall["mean_accepted_length"] == pytest.approx(runner["mean_accepted_length"])
    assert runner["decoded_every_token"] and runner["tokens_per_prompt"] == answers


def test_the_markdown_names_the_rendering_and_holds_the_overall_rows(cli_spec_bench):
    report, text = cli_spec_bench
    assert "## Spec-Bench, first turns" in text
    assert "first turns rendered by the package's chat template" in text
    assert "| **overall** | 6 | greedy | " in text
    assert text.count("| **overall** |") == len(report["runners"])
    assert f"or {MAX_NEW_TOKENS} new tokens" in text


def test_a_package_without_a_chat_template_decodes_plain_first_turns_and_says_so(plain_pair):
    run = run_bench(BenchConfig(plain_pair, new_tokens=6, warmup=0, repeats=2, threads=1,
                                proposers=("prompt_lookup",), ks=(2,), width_repeats=2,
                                spec_bench=True, per_category=1))
    report = summarize(run, "speculant bench --spec-bench")
    assert report["spec_bench"]["rendering"] == spec_prompts.PLAIN_TEXT
    assert report["prompts"]["source"].endswith(spec_prompts.PLAIN_TEXT)
    assert f"first turns as {spec_prompts.PLAIN_TEXT}" in markdown(report)
    with pytest.raises(RequestError, match="no chat template"):
        run_bench(BenchConfig(plain_pair, new_tokens=6, warmup=0, repeats=2, threads=1,
                              spec_bench=True, per_category=1, chat=True))


@pytest.mark.parametrize(("arguments", "says"), [
    (["--per-category", "2"], "--per-category needs --spec-bench"),
    (["--max-new-tokens", "8"], "--max-new-tokens needs --spec-bench"),
    (["--spec-bench", "--new-tokens", "8"], "--new-tokens does not go with --spec-bench"),
    (["--spec-bench", "--prompts", "p.json"], "--prompts does not go with --spec-bench"),
])
def test_the_cli_refuses_options_that_do_not_go_together(arguments, says):
    result = CliRunner().invoke(app, ["bench", *arguments])
    assert result.exit_code == 2 and says in result.output
