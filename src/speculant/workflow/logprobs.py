"""Log-probabilities of committed tokens under the target (``GenerationOptions.logprobs``).

The score row that chose a committed token — the prefill's last row for the first, row ``i``
of a round's verify pass for its ``i``-th committed token — is already computed; no pass is
added. A token's log-probability is the log-softmax of that raw row (before temperature,
top-k/top-p and any grammar mask, vLLM's ``raw_logprobs``), so greedy and speculative
decoding report the same values for the same tokens. The rows are read back to the host
(``k + 1`` rows a round on a device) only for requests that ask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from speculant.tensors import HOST, TensorSeam, Value


@dataclass(frozen=True)
class TokenLogprob:
    """One token and its log-probability; ``top``: the most probable ids with theirs, most
    probable first (``num_top`` of them)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Logprobs:
    """What a decode records: ``generated`` aligned with the generated tokens, ``prompt``
    with the prompt (its first entry None: nothing scores the first token), when asked."""

    num_top: int  # alternatives per token (0: the token's own log-probability only)
    wants_prompt: bool = False
    generated: list[TokenLogprob] = field(default_factory=list)
    prompt: list[TokenLogprob | None] | None = None

    def record(self, seam: TensorSeam, scores: Value, tokens: Sequence[int], *,
               first_row: int = 0, into: list | None = None) -> None:
        """Append the entries of ``tokens``, token ``i`` scored by row ``first_row + i`` of
        ``scores`` [1, n, V] (the rows of a pass, where it ran)."""
        if not tokens:
            return
        rows = seam.adopt(seam.slice_axis(scores, scores.rank - 2, first_row, len(tokens)),
                          HOST).data.reshape(len(tokens), -1).astype(np.float32)
        (self.generated if into is None else into).extend(
            entries(rows, tokens, self.num_top))

    def record_prompt(self, seam: TensorSeam, scores: Value, prompt: Sequence[int],
                      start: int = 0) -> None:
        """The prompt's entries from a prefill chunk's rows [1, n, V] from ``start`` (row
        ``i`` scores ``prompt[start + i + 1]``; a prompt prefilled in chunks, chunk by
        chunk, the first opening the list with None)."""
        if start == 0:
            self.prompt = [None]
        num_rows = scores.shape[scores.rank - 2]
        self.record(seam, scores, prompt[start + 1:start + 1 + num_rows], into=self.prompt)


def entries(rows: np.ndarray, tokens: Sequence[int], num_top: int) -> list[TokenLogprob]:
    """Each row's log-softmax at its token, and its ``num_top`` most probable ids."""
    top_of = min(num_top, rows.shape[-1])
    peak = rows.max(axis=-1, keepdims=True)
    logprobs = rows - (peak + np.log(np.exp(rows - peak).sum(axis=-1, keepdims=True)))
    found = []
    for row, token in zip(logprobs, tokens, strict=True):
        top: tuple[tuple[int, float], ...] = ()
        if top_of:
            best = np.argpartition(-row, top_of - 1)[:top_of]
            best = best[np.argsort(-row[best], kind="stable")]
            top = tuple((int(i), float(row[i])) for i in best)
        found.append(TokenLogprob(int(token), float(row[token]), top))
    return found
