"""`StopText`: the committed tokens as text, cut at the first stop string.

Stop strings are matched on the decoded text, across token boundaries: text that could still
become the start of a stop string is held back until it cannot, so the text handed out never
contains a stop string, nor a piece of one that later completes. The pieces never split a
UTF-8 character (:class:`IncrementalDetokenizer`).
"""

from __future__ import annotations

from collections.abc import Sequence

from speculant.text.detokenizer import Decoder, IncrementalDetokenizer


class StopText:
    """Fed each committed token (:meth:`push`); hands out the text that is final."""

    def __init__(self, tokenizer: Decoder, prompt_ids: Sequence[int],
                 stop: Sequence[str] = ()) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer, context_ids=prompt_ids)
        self.stop = tuple(stop)
        self.text = ""  # every piece handed out so far, or ready to be
        self._ready = ""  # final text not yet taken
        self._held = ""  # decoded text that may be the start of a stop string
        self.is_stopped = False

    def push(self, token: int) -> bool:
        """Add one committed token; True when it completes a stop string."""
        self._held += self.detokenizer.push(token)
        return self._settle(is_final=False)

    def take(self) -> str:
        """The final text since the last call."""
        piece, self._ready = self._ready, ""
        return piece

    def finish(self) -> str:
        """End of the stream: the rest of the text (none past a stop string)."""
        if not self.is_stopped:
            self._held += self.detokenizer.flush()
            self._settle(is_final=True)
        return self.take()

    def _settle(self, *, is_final: bool) -> bool:
        held = self._held
        hits = [i for i in (held.find(s) for s in self.stop) if i >= 0]
        if hits:
            self._release(held[:min(hits)])
            self._held, self.is_stopped = "", True
            return True
        keep = 0 if is_final else max((_prefix_overlap(held, s) for s in self.stop), default=0)
        self._release(held[:len(held) - keep])
        self._held = held[len(held) - keep:]
        return False

    def _release(self, text: str) -> None:
        self._ready += text
        self.text += text


def _prefix_overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for length in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-length:]):
            return length
    return 0
