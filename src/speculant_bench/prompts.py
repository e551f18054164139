"""The prompt set a bench decodes: where it comes from, and fitting it into the context.

Precedence: ``--prompts FILE``; else ``val_prompts.json`` in the package folder or beside it
(the demo pair's validation prompts); else the bundled ``prompts.json`` (code snippets). Each
file is a JSON list whose items are token-id lists or text (encoded with the package's
tokenizer), or an object whose ``prompts`` holds that list, an item then also
``{"prompt": ...}`` (the demo pair's ``val_prompts.json``: prompt, continuation, source).
With ``--chat`` each text prompt is one user message, rendered by the package's chat template
before it is encoded (token-id prompts are taken as they are).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from speculant.errors import RequestError
from speculant.text.tokenizer import Tokenizer

VAL_PROMPTS = "val_prompts.json"


@dataclass(frozen=True)
class PromptSet:
    source: str  # the file the prompts came from ("bundled" for speculant/bench/prompts.json)
    prompts: tuple[tuple[int, ...], ...]  # token ids, each fitted into the context
    num_truncated: int  # prompts whose oldest tokens were dropped to fit
    new_tokens: tuple[int, ...]  # per prompt: the tokens every runner decodes (EOS masked)

    @property
    def lengths(self) -> list[int]:
        return [len(p) for p in self.prompts]


def find_prompt_file(package: Path, prompts_file: Path | None) -> Path | None:
    """The file to read, or None for the bundled set."""
    if prompts_file is not None:
        return prompts_file
    for candidate in (package / VAL_PROMPTS, package.parent / VAL_PROMPTS):
        if candidate.is_file():
            return candidate
    return None


def read_prompts(path: Path | None, tokenizer: Tokenizer,
                 render: Callable[[str], str] | None = None) -> tuple[str, list[list[int]]]:
    """(source, token-id prompts) from ``path`` (None: the bundled set); ``render`` turns each
    text prompt into the text that is encoded (the chat template's rendering)."""
    if path is None:
        text = (resources.files("speculant_bench") / "prompts.json").read_text()
        source, file = "bundled (speculant/bench/prompts.json)", "speculant/bench/prompts.json"
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise RequestError(f"cannot read the prompt file: {exc}", file=str(path)) from exc
        source = file = str(path)
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(f"the prompt file is not JSON: {exc}", file=file) from exc
    where = ""
    if isinstance(items, dict) and "prompts" in items:  # {"prompts": [{"prompt": ...}, ...]}
        items, where = items["prompts"], ".prompts"
    if not isinstance(items, list) or not items:
        raise RequestError("the prompt file must hold a non-empty JSON list", file=file,
                           value=type(items).__name__,
                           expected="a list of token-id lists or strings, or an object with "
                                    "such a list under 'prompts'")
    prompts = []
    for i, item in enumerate(items):
        if where and isinstance(item, dict) and "prompt" in item:
            item = item["prompt"]
        if isinstance(item, str):
            prompts.append(tokenizer.encode(render(item) if render is not None else item))
        elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in item):
            prompts.append(list(item))
        else:
            raise RequestError("a prompt must be a list of token ids or a string", file=file,
                               path=f"{where}[{i}]", value=item,
                               expected="a list of int or a str")
        if not prompts[-1]:
            raise RequestError("the prompt is empty", file=file, path=f"{where}[{i}]",
                               expected="at least one token")
    return source, prompts


def fit_prompts(source: str, prompts: list[list[int]], new_tokens: int,
                context_cap: int | None) -> PromptSet:
    """Keep the newest ``context_cap − new_tokens`` tokens of each prompt, so that every
    runner can decode exactly ``new_tokens`` tokens of each (or fewer, where a Spec-Bench run
    replaces ``PromptSet.new_tokens`` by its answer lengths)."""
    room = None if context_cap is None else context_cap - new_tokens
    if room is not None and room < 1:
        raise RequestError(f"{new_tokens} new tokens leave no room for a prompt in a context "
                           f"of {context_cap}", path="new_tokens", value=new_tokens,
                           expected=f"at most {context_cap - 1}")
    fitted = [tuple(p[-room:]) if room is not None else tuple(p) for p in prompts]
    num_truncated = sum(len(f) < len(p) for f, p in zip(fitted, prompts, strict=True))
    return PromptSet(source, tuple(fitted), num_truncated, (new_tokens,) * len(fitted))
