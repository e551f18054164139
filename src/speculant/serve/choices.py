"""What the routes add per choice: the options of each of ``n`` choices (their seeds, the
grammar of ``response_format``), and log-probabilities in OpenAI's two shapes.

``n`` choices are decoded one after another, each a request of its own to the engine (it
decodes one sequence at a time); choice 0 keeps the request's seed, so ``n: 1`` answers as
before, and choice ``i`` gets a seed derived from ``(seed, i)``. Without a seed each choice
draws a fresh one (greedy choices are all the same text, as in vLLM).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from speculant import GenerationOptions, Grammar


def choice_options(options: GenerationOptions, n: int) -> list[GenerationOptions]:
    """``options`` for each of ``n`` choices: seed ``s`` for choice 0, then seeds derived
    from ``(s, i)`` (numpy's SeedSequence)."""
    seed = options.seed
    if n == 1 or not isinstance(seed, int) or seed < 0:
        return [options] * n  # a bad seed is the engine's to refuse
    derived = [int(np.random.SeedSequence([seed, i]).generate_state(1, np.uint64)[0] >> 1)
               for i in range(1, n)]
    return [options, *(dataclasses.replace(options, seed=s) for s in derived)]


def format_grammar(response_format: Any) -> Grammar | None:
    """The grammar of ``response_format`` (None for ``text`` or none)."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return Grammar.json_schema()
    return Grammar.json_schema(response_format.json_schema.schema_)


def _token(tokenizer: Any, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


def chat_logprobs(tokenizer: Any, entries: Sequence[Any], num_top: int) -> dict:
    """``{"content": [{token, logprob, bytes, top_logprobs}, …]}`` (chat completions)."""
    def entry(token: int, logprob: float) -> dict:
        text = _token(tokenizer, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**entry(e.token, e.logprob),
                         "top_logprobs": [entry(i, lp) for i, lp in e.top[:num_top]]}
                        for e in entries]}


def completion_logprobs(tokenizer: Any, tokens: Sequence[int], entries: Sequence[Any]) -> dict:
    """``{tokens, token_logprobs, top_logprobs, text_offset}`` (completions) of ``tokens``
    with their ``entries`` (None: no log-probability, as the first prompt token's under
    ``echo``). Each token's ``top_logprobs`` holds itself and its alternatives."""
    shaped: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                               "text_offset": []}
    offset = 0
    for token, e in zip(tokens, entries, strict=True):
        text = _token(tokenizer, token)
        shaped["tokens"].append(text)
        shaped["token_logprobs"].append(None if e is None else e.logprob)
        shaped["top_logprobs"].append(None if e is None else {
            text: e.logprob, **{_token(tokenizer, i): lp for i, lp in e.top}})
        shaped["text_offset"].append(offset)
        offset += len(text)
    return shaped
