"""Requests that look like what users ask, sampled from the target itself ("Magpie").

    chat = ChatPrompts(template, tokenizer)
    opener = chat.user_turn_opener(cue)      # the template's text up to the user's content
    requests = clean_requests(raw, min_chars=12)       # deduplicated, in order
    train, held_out = split_by_request(requests, held_out_fraction=0.05)

An instruction-tuned model given its chat template's user-turn opening alone writes a user
request from the distribution it was tuned on. The opening is the template rendered with a
system cue and a user message whose content is a sentinel, cut at the sentinel; the cue
steers the request toward one of :data:`CATEGORIES` (a template that refuses a system message
gets no cue). Requests end at the first special token (the end of the user's turn).

Deduplication: two requests are the same when their normalized texts (lowercase, letters and
digits only, single spaces) are equal, or when their word 3-gram sets overlap with Jaccard
similarity >= :data:`NEAR_DUPLICATE_JACCARD`; the first one is kept. The held-out split is by
request: a request and its answers are on one side only.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass

from speculant.text.chat import ChatTemplate
from speculant.text.tokenizer import Tokenizer

NEAR_DUPLICATE_JACCARD = 0.6
_SENTINEL = "\u2063speculant-user-content\u2063"

# Each category's cues: a system line that tells the model what the user will ask about.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "writing": ("You are a helpful assistant. The user asks you to write something: a story, "
                "a poem, an email, a speech or a blog post.",
                "You help people with creative writing and everyday writing tasks."),
    "coding": ("You are a programming assistant. The user asks for code, or for help "
               "understanding or fixing code, in Python, JavaScript, SQL, C or another "
               "language.",
               "You are an expert software engineer who answers programming questions."),
    "math": ("You are a maths tutor. The user asks you to solve a maths problem step by step: "
             "arithmetic, algebra, geometry, probability or calculus.",
             "You help students with maths homework and word problems."),
    "extraction": ("You are a helpful assistant. The user gives you a text and asks you to "
                   "extract information from it: names, dates, numbers, a table or JSON.",
                   "You pull structured facts out of documents the user pastes."),
    "translation": ("You are a translator. The user asks you to translate a sentence or a "
                    "short text between English, French, Spanish, German or Chinese.",
                    "You help people translate and understand phrases in other languages."),
    "summarization": ("You are a helpful assistant. The user pastes an article, a report or "
                      "a conversation and asks for a short summary.",
                      "You summarize texts clearly and briefly."),
    "roleplay": ("You are a helpful assistant. The user asks you to play a character or "
                 "imagine a scenario and respond in that role.",
                 "You take part in role-play and interactive stories with the user."),
    "reasoning": ("You are a careful thinker. The user asks a logic puzzle, a riddle or a "
                  "question that needs step-by-step reasoning.",
                  "You help people reason through decisions and tricky questions."),
    "stem": ("You are a science teacher. The user asks about physics, chemistry, biology, "
             "computer science or engineering.",
             "You explain how things work in science and technology."),
    "humanities": ("You are a knowledgeable assistant. The user asks about history, "
                   "philosophy, literature, economics, law or culture.",
                   "You answer questions about history, society and the arts."),
}


@dataclass(frozen=True)
class Request:
    """One user request: its text, the category that steered it, and its split."""

    text: str
    category: str
    is_held_out: bool = False

    @property
    def key(self) -> str:
        return normalized(self.text)


class ChatPrompts:
    """The target's chat template and tokenizer, for openers and prompts."""

    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer) -> None:
        self.template, self.tokenizer = template, tokenizer
        special = tokenizer.backend.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, t in special.items() if t.special)

    def user_turn_opener(self, cue: str | None) -> list[int]:
        """Token ids of the template's text up to where the user's content goes, after a
        system message ``cue`` (none: the template's own default)."""
        messages = ([{"role": "system", "content": cue}] if cue else []) + [
            {"role": "user", "content": _SENTINEL}]
        text = self.template.render(messages, add_generation_prompt=False)
        return self.tokenizer.encode(text.split(_SENTINEL, 1)[0])

    def accepts_system_messages(self) -> bool:
        try:
            self.user_turn_opener("x")
        except Exception:  # noqa: BLE001 (a template's own raise_exception, any wording)
            return False
        return True

    def answer_prompt(self, request: str) -> list[int]:
        """Token ids of the prompt a user's request makes: the template with the request as
        the one user message (the template's default system message) and the assistant's
        turn opened, as ``speculant chat`` renders it."""
        text = self.template.render([{"role": "user", "content": request}],
                                    add_generation_prompt=True)
        return self.tokenizer.encode(text)

    def request_text(self, generated: list[int]) -> tuple[str, bool]:
        """The request in ``generated`` ids: the text before the first special token, and
        whether it ended there (False: cut off by the length cap)."""
        for i, token in enumerate(generated):
            if token in self.special_ids:
                return self.tokenizer.decode(generated[:i]).strip(), True
        return self.tokenizer.decode(generated).strip(), False


def normalized(text: str) -> str:
    """Lowercase, letters and digits only, single spaces."""
    return " ".join(re.sub(r"[^\w]+", " ", text.lower()).split())


def shingles(text: str, n: int = 3) -> set[tuple[str, ...]]:
    words = normalized(text).split()
    if len(words) < n:
        return {tuple(words)}
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def clean_requests(requests: list[Request], min_chars: int) -> list[Request]:
    """``requests`` without the too short, the exact and the near duplicates (in order;
    the first of each kind kept)."""
    kept: list[Request] = []
    seen: set[str] = set()
    kept_shingles: list[set[tuple[str, ...]]] = []
    index: dict[tuple[str, ...], list[int]] = {}
    for request in requests:
        key = request.key
        if len(key) < min_chars or key in seen:
            continue
        mine = shingles(request.text)
        overlaps = Counter(j for s in mine for j in index.get(s, ()))
        if any(shared / len(mine | kept_shingles[j]) >= NEAR_DUPLICATE_JACCARD
               for j, shared in overlaps.items()):
            continue
        seen.add(key)
        for s in mine:
            index.setdefault(s, []).append(len(kept))
        kept_shingles.append(mine)
        kept.append(request)
    return kept


def split_by_request(requests: list[Request], held_out_fraction: float
                     ) -> list[Request]:
    """``requests`` with ``is_held_out`` set: the ``max(1, round(fraction * n))`` requests
    whose normalized text hashes lowest (a function of the request alone, so a request and
    its answers land on one side)."""
    if not requests:
        return []
    count = min(len(requests) - 1, max(1, round(held_out_fraction * len(requests))))
    ranked = sorted(range(len(requests)),
                    key=lambda i: hashlib.sha256(requests[i].key.encode()).hexdigest())
    held = set(ranked[:count]) if held_out_fraction > 0 else set()
    return [Request(r.text, r.category, i in held) for i, r in enumerate(requests)]
