"""Prompt lookup (runtime.md §18): model-free n-gram drafts from the committed stream.

No model, no state, zero proposer invocations; the drafts are deterministic, so the verifier
takes ``q = δ_d`` under sampling. The rollback bound is the smallest ``rollback_positions`` of
the target's state groups (checked at admission).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from speculant.speculative.proposal import Proposal
from speculant.workflow.state import DecodeState


def lookup_drafts(stream: Sequence[int], k: int, n_max: int = 3, n_min: int = 1) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the stream's
    last ``n`` tokens, trying ``n = n_max … n_min``; ``[]`` when no n-gram recurs.

    The final n-gram itself (ending at the last token) is excluded, so an occurrence starts
    at most at ``len(stream) − n − 1`` and at least one token follows it; occurrences may
    overlap the final n-gram. ``stream`` is ``x[0..L)``, the pending token last.
    """
    tokens = np.asarray(stream, dtype=np.int64)  # [L]
    length = len(tokens)
    if k < 1:
        return []
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)  # [L - n, n]
        hits = np.flatnonzero((windows == tokens[length - n:]).all(axis=1))  # start indices
        if hits.size:
            start = int(hits[-1]) + n  # the tokens after the most recent occurrence
            return [int(t) for t in tokens[start:start + k]]
    return []


@dataclass(frozen=True)
class PromptLookupProposer:
    """Drafts by :func:`lookup_drafts` over the stream ``x[0..L)``."""

    n_min: int = 1
    n_max: int = 3

    def propose(self, state: DecodeState, k: int) -> Proposal:
        return Proposal(lookup_drafts(state.tokens, k, self.n_max, self.n_min))
