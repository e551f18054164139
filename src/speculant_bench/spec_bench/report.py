"""The Spec-Bench part of a bench report: per category and overall, each runner's speed, its
speedup over our greedy, and its acceptance, in the leaderboard's form.

Every figure of a category pools that category's questions, as the bench's figures pool the
whole prompt set: a repeat's tokens/s is the category's tokens over its seconds, and the table
shows the median over repeats. *× greedy* is a runner's median over our greedy's median on the
same questions in the same run. Acceptance is exact (greedy decoding is deterministic) and
comes from the last repeat's `DecodeStats`: *mean accepted length* is the committed tokens per
verification round (the mean of a_r, a correction or bonus token included), *first draft
accepted* the fraction of rounds whose first draft was accepted. The *overall* row pools every
question of the run.
"""

from __future__ import annotations

from collections.abc import Sequence

from speculant_bench.figures import decode_tokens_per_s, end_to_end_tokens_per_s
from speculant_bench.run import BenchRun, RunnerResult
from speculant_bench.spec_bench.prompts import CHAT_TEMPLATE
from speculant_bench.spec_bench.questions import VENDORED, categories
from speculant_bench.spread import Spread

OVERALL = "overall"


def _ratio(value: float, base: float) -> float | None:
    return value / base if base else None


def category_row(category: str, indices: Sequence[int], result: RunnerResult,
                 greedy: RunnerResult) -> dict:
    """One runner's figures over the questions at ``indices`` of the run's prompt set."""
    def picked(samples):
        return [samples[i] for i in indices]

    decode = Spread.of([decode_tokens_per_s(picked(s)) for s in result.samples])
    end_to_end = Spread.of([end_to_end_tokens_per_s(picked(s)) for s in result.samples])
    greedy_decode = Spread.of([decode_tokens_per_s(picked(s)) for s in greedy.samples])
    greedy_end_to_end = Spread.of([end_to_end_tokens_per_s(picked(s))
                                   for s in greedy.samples])
    stats = picked(result.stats)
    rounds = sum(s.rounds for s in stats)
    committed_in_rounds = sum(a for s in stats for _, a in s.trace)
    first_accepted = sum(s.rounds_with_first_draft_accepted for s in stats)
    reference = [s.token_ids for s in picked(greedy.samples[-1])]
    return {
        "category": category,
        "questions": len(indices),
        "runner": result.runner.name,
        "proposer": result.runner.proposer,
        "k": result.runner.k,
        "tokens": sum(len(s.token_ids) for s in picked(result.samples[-1])),
        "decode_tokens_per_s": decode.as_dict(),
        "end_to_end_tokens_per_s": end_to_end.as_dict(),
        "speedup_decode": _ratio(decode.median, greedy_decode.median),
        "speedup_end_to_end": _ratio(end_to_end.median, greedy_end_to_end.median),
        "rounds": rounds,
        "mean_accepted_length": committed_in_rounds / rounds if rounds else None,
        "first_draft_acceptance": first_accepted / rounds if rounds else None,
        "matches_greedy": None if result is greedy else all(
            [s.token_ids for s in picked(samples)] == reference for samples in result.samples),
    }


def annotate(report: dict, run: BenchRun) -> dict:
    """Add ``spec_bench`` to a bench report (nothing unless the run was a Spec-Bench run):
    per category, the package's runners, then each compared package's (× its own greedy)."""
    chosen = run.spec_bench
    greedy = next((r for r in run.results if not r.runner.is_speculative), None)
    if chosen is None or greedy is None:
        return report
    contenders = [(run.results, greedy)]  # the package's runners, then each compared one's
    for package in run.compared:
        results = [r for r in run.compared_results if r.runner.label == package.label]
        its_greedy = next((r for r in results if not r.runner.is_speculative), None)
        if its_greedy is not None:
            contenders.append((results, its_greedy))
    questions = chosen.questions
    groups = [(category, [i for i, q in enumerate(questions) if q.category == category])
              for category in categories(questions)]
    groups.append((OVERALL, list(range(len(questions)))))
    report["spec_bench"] = {
        "source": chosen.source,
        "file": VENDORED,
        "rendering": chosen.rendering,
        "questions_in_file": chosen.num_in_file,
        "per_category": chosen.per_category,
        "max_new_tokens": chosen.max_new_tokens,
        "questions": [{"question_id": q.question_id, "category": q.category,
                       "subcategory": q.subcategory, "prompt_tokens": length,
                       "answer_tokens": n}
                      for q, length, n in zip(questions, run.prompts.lengths,
                                              run.prompts.new_tokens, strict=True)],
        "rows": [category_row(category, indices, result, its_greedy)
                 for category, indices in groups
                 for results, its_greedy in contenders for result in results],
    }
    return report


def _cell(value: float | None, form: str, unit: str = "") -> str:
    """``value`` formatted, with its unit, or – where there is none."""
    return "–" if value is None else format(value, form) + unit


def _span(values: Sequence[int]) -> str:
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}–{high}"


def markdown(report: dict) -> list[str]:
    """The per-category table (no lines unless the report has a ``spec_bench`` section)."""
    section = report.get("spec_bench")
    if section is None:
        return []
    rows = section["rows"]
    asked = section["per_category"]
    answers = [q["answer_tokens"] for q in section["questions"]]
    lines = [
        "## Spec-Bench, first turns", "",
        f"- questions: {len(section['questions'])} of the {section['questions_in_file']} in "
        f"Spec-Bench (`{section['file']}`, "
        + (f"at most {asked} per category" if asked else "all of them")
        + "), first turns " + ("rendered by the package's chat template"
                               if section["rendering"] == CHAT_TEMPLATE
                               else f"as {section['rendering']}"),
        f"- answers: greedy's, to the end of its turn or {section['max_new_tokens']} new tokens "
        f"({_span(answers)} tokens each, {sum(answers)} in all); every runner decodes each "
        "question's answer length, EOS masked",
        "- tok/s: decode tokens/s (after the first token), median over repeats, each repeat "
        "pooling the category's questions; × greedy: over our greedy on the same questions "
        "in this run (decode, and end to end with the prefill); mean accepted length: tokens "
        "committed per verification round; first draft accepted: share of rounds",
        "",
        "| category | questions | runner | tok/s | × our greedy | end-to-end × greedy | "
        "mean accepted length | first draft accepted |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        category = f"**{row['category']}**" if row["category"] == OVERALL else row["category"]
        lines.append(
            f"| {category} | {row['questions']} | {row['runner']} | "
            f"{row['decode_tokens_per_s']['median']:.1f} | "
            f"{_cell(row['speedup_decode'], '.2f', '×')} | "
            f"{_cell(row['speedup_end_to_end'], '.2f', '×')} | "
            f"{_cell(row['mean_accepted_length'], '.2f')} | "
            f"{_cell(row['first_draft_acceptance'], '.0%')} |")
    differing = sorted({f"{r['runner']} ({r['category']})" for r in rows
                        if r["matches_greedy"] is False and r["category"] != OVERALL})
    if differing:
        lines += ["", f"Not greedy's tokens: {', '.join(differing)}."]
    return lines + ["", "## Every runner, all questions pooled", ""]
