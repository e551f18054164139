"""Spec-Bench questions as a bench's prompts: each first turn rendered as one user message by
the package's chat template (``Engine.render_chat``), or taken as plain text where the package
has none; and each question's answer length, which every runner then decodes.

The answer length of a question is the number of tokens greedy decodes before the answer ends
(the package's EOS, or the chat template's end of turn, stopping as ``Engine.chat`` stops), at
most ``max_new_tokens``. Timed runners decode exactly that many tokens with EOS masked, so they
decode the same answer as greedy (speculative decoding is greedy token for token), and so do
the anchors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from speculant.engine import Engine
from speculant.errors import RequestError
from speculant.workflow.options import GenerationOptions
from speculant_bench.spec_bench.questions import (
    VENDORED,
    Question,
    read_questions,
    select_questions,
)

CHAT_TEMPLATE = "chat template"
PLAIN_TEXT = "plain text: the package has no chat template"


@dataclass(frozen=True)
class SpecBenchSet:
    """The Spec-Bench questions of a run, one per prompt of its prompt set, in order."""

    questions: tuple[Question, ...]
    rendering: str  # CHAT_TEMPLATE, or PLAIN_TEXT where the package has none
    max_new_tokens: int  # the longest answer decoded
    per_category: int | None  # questions asked for per category (None: all)
    num_in_file: int  # questions in the file, selected or not

    @property
    def source(self) -> str:
        return f"Spec-Bench ({VENDORED}), first turns, {self.rendering}"


def spec_bench_prompts(engine: Engine, per_category: int | None, max_new_tokens: int, *,
                       needs_template: bool = False) -> tuple[SpecBenchSet, list[list[int]]]:
    """The vendored questions, ``per_category`` of each category (None: all), and the token
    ids of their first turns (:func:`first_turn_prompts`)."""
    every = read_questions()
    questions = select_questions(every, per_category)
    rendering, prompts = first_turn_prompts(engine, questions, needs_template=needs_template)
    return SpecBenchSet(tuple(questions), rendering, max_new_tokens, per_category,
                        len(every)), prompts


def first_turn_prompts(engine: Engine, questions: Sequence[Question], *,
                       needs_template: bool = False) -> tuple[str, list[list[int]]]:
    """(how the first turns were rendered, their token ids). ``needs_template``: a package
    without a chat template is refused (``Engine.render_chat``'s RequestError) instead of
    taking each first turn as plain text."""
    if engine.chat_template is None and not needs_template:
        return PLAIN_TEXT, [engine.tokenizer.encode(q.first_turn) for q in questions]
    return CHAT_TEMPLATE, [
        engine.tokenizer.encode(engine.render_chat([{"role": "user", "content": q.first_turn}]))
        for q in questions]


def answer_options(engine: Engine, max_new_tokens: int) -> GenerationOptions:
    """Greedy options that stop where an answer ends: the package's EOS ids, and the chat
    template's end-of-turn texts (one-token ones as stop ids, longer ones as stop strings)."""
    stop_ids: list[int] = []
    stops: list[str] = []
    if engine.chat_template is not None:
        for ending in engine.chat_template.end_of_turn_texts():
            ids = engine.tokenizer.encode(ending, add_special_tokens=False)
            if len(ids) == 1:
                stop_ids.append(ids[0])
            else:
                stops.append(ending)
    return GenerationOptions(max_new_tokens=max_new_tokens, stop_on_eos=True,
                             stop_token_ids=tuple(stop_ids), stop=tuple(stops))


def answer_lengths(engine: Engine, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                   on_step: Callable[[], None] | None = None) -> list[int]:
    """Each prompt's answer length (module docstring): between 1 and ``max_new_tokens``."""
    if max_new_tokens < 1:
        raise RequestError("an answer needs at least one new token", path="--max-new-tokens",
                           value=max_new_tokens, expected="an integer >= 1")
    options = answer_options(engine, max_new_tokens)
    lengths = []
    for prompt in prompts:
        lengths.append(max(1, len(engine.generate(list(prompt), options).token_ids)))
        if on_step is not None:
            on_step()
    return lengths
