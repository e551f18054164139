"""Spec-Bench's questions: read, checked line by line, grouped into the leaderboard's
categories, and selected.

A question's *category* is the leaderboard's task: the file's ``category`` field, except that
MT-Bench's eight subcategories (:data:`MT_BENCH_SUBCATEGORIES`) make one category,
:data:`MT_BENCH`; the field itself stays the question's *subcategory*. Categories come from the
file, in the order they first appear; nothing here assumes how many questions each holds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from itertools import chain, zip_longest
from pathlib import Path

from speculant.errors import RequestError

QUESTIONS_FILE = "question.jsonl"  # beside this module: the vendored Spec-Bench questions
VENDORED = "speculant_bench/spec_bench/question.jsonl"  # how a report names that file
MT_BENCH = "mt_bench"  # the leaderboard's multi-turn conversation category
MT_BENCH_SUBCATEGORIES = frozenset({"writing", "roleplay", "reasoning", "math", "coding",
                                    "extraction", "stem", "humanities"})
EXPECTED_LINE = ('a JSON object {"question_id": int, "category": str, "turns": [str, ...]} '
                 "with at least one non-empty turn")


@dataclass(frozen=True)
class Question:
    question_id: int
    category: str  # the leaderboard's category (mt_bench, translation, ..., rag)
    subcategory: str  # the file's category field (one of MT-Bench's eight within mt_bench)
    first_turn: str  # the first user message: what the bench decodes an answer to


def read_questions(path: Path | None = None) -> list[Question]:
    """Every question of ``path`` (None: the vendored file), in file order. A malformed line
    raises RequestError naming the file, the line number, the field and its value."""
    if path is None:
        text = (resources.files(__package__) / QUESTIONS_FILE).read_text(encoding="utf-8")
        file = VENDORED
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise RequestError(f"cannot read the Spec-Bench questions: {exc}",
                               file=str(path)) from exc
        file = str(path)
    questions = [_question(line, file, number)
                 for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not questions:
        raise RequestError("the Spec-Bench file holds no question", file=file,
                           expected=f"one line per question, each {EXPECTED_LINE}")
    return questions


def _question(line: str, file: str, number: int) -> Question:
    where = f"line {number}"
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise RequestError(f"the line is not JSON: {exc.msg}", file=file, path=where,
                           value=line, expected=EXPECTED_LINE) from exc
    if not isinstance(item, dict):
        raise RequestError("the line is not a JSON object", file=file, path=where,
                           value=item, expected=EXPECTED_LINE)
    question_id, category, turns = (item.get(key) for key in ("question_id", "category",
                                                              "turns"))
    if not isinstance(question_id, int) or isinstance(question_id, bool):
        raise RequestError("question_id must be an integer", file=file,
                           path=f"{where}.question_id", value=question_id,
                           expected=EXPECTED_LINE)
    if not isinstance(category, str) or not category.strip():
        raise RequestError("category must be a non-empty string", file=file,
                           path=f"{where}.category", value=category, expected=EXPECTED_LINE)
    if not isinstance(turns, list) or not turns \
            or not all(isinstance(turn, str) for turn in turns) or not turns[0].strip():
        raise RequestError("turns must be a list of strings whose first is not empty",
                           file=file, path=f"{where}.turns", value=turns,
                           expected=EXPECTED_LINE)
    grouped = MT_BENCH if category in MT_BENCH_SUBCATEGORIES else category
    return Question(question_id, grouped, category, turns[0])


def categories(questions: Sequence[Question]) -> list[str]:
    """The categories of ``questions``, in the order they first appear."""
    return list(dict.fromkeys(q.category for q in questions))


def select_questions(questions: Sequence[Question], per_category: int | None = None
                     ) -> list[Question]:
    """At most ``per_category`` questions of each category (None: all), grouped by category
    in :func:`categories` order. Within a category its subcategories take turns (so
    ``mt_bench`` with 8 holds one question of each), each in file order."""
    if per_category is not None and per_category < 1:
        raise RequestError("a Spec-Bench run needs at least one question per category",
                           path="--per-category", value=per_category,
                           expected="an integer >= 1, or no --per-category for all")
    selected: list[Question] = []
    for category in categories(questions):
        members = [q for q in questions if q.category == category]
        by_subcategory = [[q for q in members if q.subcategory == sub]
                          for sub in dict.fromkeys(q.subcategory for q in members)]
        interleaved = [q for q in chain.from_iterable(zip_longest(*by_subcategory))
                       if q is not None]
        selected += interleaved[:per_category]
    return selected
