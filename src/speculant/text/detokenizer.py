"""Streaming detokenization that never emits a broken character.

A byte-level BPE token may hold half of a UTF-8 character; decoding it alone gives U+FFFD.
:class:`IncrementalDetokenizer` holds such text back until the character is complete, and
decodes only a short window of ids per token (the prefix-offset / read-offset technique of
HF text-generation-inference and vLLM), so a token costs O(window), not O(stream).

The window is ``ids[prefix_offset:]``. ``ids[prefix_offset:read_offset]`` is text already
emitted, kept as left context so that decoders which treat the first token specially (a
stripped leading space) decode the new ids exactly as they would mid-stream. A push decodes
the window; if the text grew and does not end in U+FFFD, the growth is emitted and the window
slides: ``prefix_offset <- read_offset``, ``read_offset <- len(ids)``.

Invariant: ``"".join(pieces) + flush() == tokenizer.decode(ids)`` for the ids pushed, where
``pieces`` are every value :meth:`push` returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"  # what the tokenizers library decodes an incomplete character to

# Context ids kept from ``context_ids``: enough for decoders that look at the previous token
# (a leading space, a merge across the seam); the value vLLM uses.
NUM_CONTEXT_IDS = 5


class Decoder(Protocol):
    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns token ids, one at a time, into text pieces that concatenate to the full decode.

    ``context_ids`` (the prompt, say) are decoded as left context but never emitted: then
    the pieces equal ``decode(tail + ids)[len(decode(tail)):]`` with ``tail`` the last
    :data:`NUM_CONTEXT_IDS` context ids, so the first generated word keeps its leading space.
    The context must end on a character boundary (a prompt's ids always do). A
    :class:`~speculant.text.tokenizer.NoTokenizer` is refused here, before the first token.
    """

    def __init__(
        self,
        tokenizer: Decoder,
        *,
        context_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        if not getattr(tokenizer, "has_text", True):
            tokenizer.decode([])  # raises its RequestError now, not mid-stream
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # ids[prefix_offset:]; the ids before _read_offset are emitted text
        self._window: list[int] = [int(i) for i in context_ids[-NUM_CONTEXT_IDS:]]
        self._read_offset = len(self._window)
        self._prefix_text = self._decode(self._window)  # decode(_window[:_read_offset])

    @property
    def num_held_ids(self) -> int:
        """Ids pushed whose text has not been emitted yet."""
        return len(self._window) - self._read_offset

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes ("" while a character is still open)."""
        self._window.append(int(token_id))
        text = self._decode(self._window)
        if len(text) <= len(self._prefix_text) or text.endswith(REPLACEMENT_CHAR):
            return ""
        return self._emit(text)

    def push_many(self, token_ids: Sequence[int]) -> str:
        """Add several ids (an accepted block, say); return the text they complete."""
        return "".join(self.push(token_id) for token_id in token_ids)

    def flush(self) -> str:
        """End of stream: return the held-back text, incomplete characters and all (as
        U+FFFD, exactly as ``decode`` renders them)."""
        if self.num_held_ids == 0:
            return ""
        text = self._decode(self._window)
        return self._emit(text) if len(text) > len(self._prefix_text) else ""

    def _emit(self, text: str) -> str:
        """Return the window text past the emitted prefix, then slide the window."""
        piece = text[len(self._prefix_text):]
        self._window = self._window[self._read_offset:]
        self._read_offset = len(self._window)
        self._prefix_text = self._decode(self._window)
        return piece

    def _decode(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)
