"""Constrained decoding: a grammar masks the target's score rows (docs/design/structured.md).

A :class:`Grammar` (a JSON schema, any JSON object, a Lark grammar or a regex) is compiled at
admission by llguidance (the ``structured`` extra) into a :class:`Constraint`, the logits
processor of one decode. Its invariant: between rounds, its matcher has consumed exactly the
tokens committed after the prompt. Verification asks it to mask a block's rows: row 0 by
the matcher's state, then the matcher advances along the drafts and row ``i`` is masked by
its state after ``d_1 … d_i``; a draft the grammar rejects leaves the rows after it as they
are (acceptance ends at that draft: the target's masked choice there is never it). The
matcher is then rolled back to the committed tokens, and advanced by those the round
commits, so it moves back exactly as the caches do. Every committed token is the target's
masked choice, with or without drafts: constrained speculative output is constrained plain
output, token for token. When the grammar can take no more tokens the decode stops
(``stop_reason`` "grammar").

Proposers draft under the same matcher (``drafting``): a proposal's drafts start with the
tokens the grammar forces (llguidance's fast-forward tokens), each later draft is one the
grammar allows after the drafts before it, and the matcher is rolled back when the proposal
is made. Where the grammar allows exactly one id, every other id of the target's masked row
is -inf, so its masked argmax (or any draw from it) is that id: a forced draft is accepted
whenever the round reaches it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from speculant.errors import ContractError, RequestError
from speculant.tensors import HOST, TensorSeam, Value

GRAMMAR_KINDS = ("json_schema", "lark", "regex")
INSTALL = "pip install 'speculant[structured]' (llguidance)"
# JSON as json.dumps writes it (", " and ": ", no other whitespace): a small model under a
# grammar that allows any whitespace can spend its tokens on it; keywords llguidance does
# not implement (formats it does not know) are ignored, not refused.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
                "lenient": True}


@dataclass(frozen=True)
class Grammar:
    """What the output must match: ``kind`` one of :data:`GRAMMAR_KINDS`, ``source`` its
    text (a JSON schema as JSON text)."""

    kind: str
    source: str

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str | None = None) -> Grammar:
        """An instance of ``schema`` (None: any JSON object)."""
        if schema is None:
            schema = {"type": "object"}
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def lark(cls, grammar: str) -> Grammar:
        return cls("lark", grammar)

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        return cls("regex", pattern)

    def checked(self) -> Grammar:
        if self.kind not in GRAMMAR_KINDS or not isinstance(self.source, str):
            raise RequestError(f"grammar kind {self.kind!r} with a {type(self.source).__name__}"
                               " source", path="grammar", value=self.kind,
                               expected=f"one of {', '.join(GRAMMAR_KINDS)} with text")
        return self


@functools.lru_cache(maxsize=8)
def _tokenizer(tokenizer_file: str, stop_ids: tuple[int, ...]) -> Any:
    """llguidance's view of a vocabulary (about 0.4 s for 49k ids: made once per file and
    stop set); the stop ids are what the grammar allows where it may end."""
    import llguidance

    return llguidance.LLTokenizer(tokenizer_file, eos_token=list(stop_ids) or None)


def compile_constraint(grammar: Grammar, tokenizer_file: Path | None,
                       stop_ids: Sequence[int], vocab_width: int) -> Constraint:
    """The matcher of ``grammar`` over the package's vocabulary, before any token; a grammar
    that does not compile is a :class:`RequestError` naming llguidance's reason."""
    try:
        import llguidance
    except ImportError:
        raise RequestError("a grammar (response_format, a forced tool call) needs llguidance, "
                           "which is not installed", path="grammar",
                           remedy=INSTALL) from None
    if tokenizer_file is None:
        raise RequestError("a grammar needs the package's tokenizer.json, and it has none",
                           path="grammar", remedy="add tokenizer.json to the package")
    grammar = grammar.checked()
    try:
        if grammar.kind == "json_schema":
            text = llguidance.LLMatcher.grammar_from_json_schema(grammar.source,
                                                                 defaults=JSON_OPTIONS)
        elif grammar.kind == "lark":
            text = llguidance.LLMatcher.grammar_from_lark(grammar.source)
        else:
            text = llguidance.LLMatcher.grammar_from_regex(grammar.source)
    except ValueError as error:
        raise RequestError(f"the {grammar.kind} is not JSON: {error}", path="grammar",
                           value=grammar.source[:200]) from None
    tokenizer = _tokenizer(str(tokenizer_file), tuple(sorted(set(stop_ids))))
    matcher = llguidance.LLMatcher(tokenizer, text, log_level=0)
    if matcher.is_error():
        raise RequestError(f"the {grammar.kind} does not compile: {matcher.get_error()}",
                           path="grammar", value=grammar.source[:200],
                           expected="a JSON schema, Lark grammar or regex llguidance accepts")
    return Constraint(matcher, tokenizer.vocab_size, vocab_width)


class Constraint:
    """One decode's grammar matcher, as the verifier's logits processor."""

    def __init__(self, matcher: Any, num_ids: int, vocab_width: int) -> None:
        self.matcher = matcher
        self.vocab_width = vocab_width  # V: the target's score rows
        self._bitmask = np.zeros((1, (max(num_ids, vocab_width) + 31) // 32), np.int32)
        self._num_drafted = 0  # drafts consumed within `drafting`, rolled back on leaving it

    @property
    def is_finished(self) -> bool:
        """The grammar can take no more tokens."""
        return bool(self.matcher.is_stopped())

    def mask_rows(self, seam: TensorSeam, scores: Value, drafts: Sequence[int]) -> Value:
        """``scores`` [1, n, V] with ids the grammar refuses at -inf: row ``i`` by the state
        after ``drafts[:i]``, up to the first draft it refuses (rows after it unchanged);
        a masked copy where ``scores`` live, the matcher left as it was."""
        rows = np.array(seam.adopt(scores, HOST).data, copy=True)  # [1, n, V]
        matcher, num_consumed = self.matcher, 0
        for i in range(rows.shape[-2]):
            allowed = self._allowed()
            rows[0, i, ~allowed] = -np.inf
            if i >= len(drafts) or not allowed[drafts[i]] or \
                    not matcher.consume_token(int(drafts[i])):
                break
            num_consumed += 1
        if num_consumed and not matcher.rollback(num_consumed):
            raise self._broken("rolling back the drafts")
        masked = Value.host(rows, scores.dtype)
        return masked if scores.residency == HOST else seam.adopt(masked, scores.residency)

    def commit(self, token: int) -> None:
        """Advance by a committed token (always one the mask allowed)."""
        if not self.matcher.consume_token(int(token)):
            raise self._broken(f"committing token {token}")

    def forced_tokens(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the grammar forces next (llguidance's fast-forward tokens:
        the canonical tokenization of the bytes every continuation starts with), by the
        matcher's state; each is one the grammar allows after those before it."""
        if limit < 1 or self.is_finished:
            return []
        return [int(t) for t in self.matcher.compute_ff_tokens()[:limit]]

    def num_valid(self, drafts: Sequence[int]) -> int:
        """How many of ``drafts``, from the first, the grammar allows in turn (by the
        matcher's state; it is left as it was)."""
        return int(self.matcher.validate_tokens([int(t) for t in drafts])) if drafts else 0

    @contextmanager
    def drafting(self) -> Iterator[Constraint]:
        """Within it, :meth:`advance` moves the matcher along one proposal's drafts (so
        :meth:`mask_rows` masks by the state after them); leaving it rolls them back, to
        the committed tokens."""
        self._num_drafted = 0
        try:
            yield self
        finally:
            num_drafted, self._num_drafted = self._num_drafted, 0
            if num_drafted and not self.matcher.rollback(num_drafted):
                raise self._broken("rolling back a proposal's drafts")

    def advance(self, draft: int) -> bool:
        """Consume ``draft`` (within :meth:`drafting`); False where the grammar refuses it
        (the matcher unmoved)."""
        if self.is_finished or self.num_valid([draft]) != 1:
            return False  # (llguidance's matcher errs for good on consuming a refused id)
        if not self.matcher.consume_token(int(draft)):
            raise self._broken(f"consuming draft {draft}")
        self._num_drafted += 1
        return True

    def _allowed(self) -> np.ndarray:
        """[V] bool: the ids the grammar allows next."""
        import llguidance.numpy

        if self.matcher.is_error():
            raise self._broken("computing a mask")
        llguidance.numpy.fill_next_token_bitmask(self.matcher, self._bitmask)
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")
        return bits[:self.vocab_width].astype(bool)

    def _broken(self, doing: str) -> ContractError:
        return ContractError(f"the grammar's matcher failed {doing}: "
                             f"{self.matcher.get_error() or 'no reason given'}",
                             path="grammar", remedy="report it with the grammar and prompt")
