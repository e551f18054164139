"""Prompt lookup (docs/design/spec/runtime.md §18): model-free n-gram drafts from committed tokens.

No model, no state, zero proposer invocations; the drafts are deterministic, so the verifier
takes ``q = δ_d`` under sampling. The rollback bound is the smallest ``rollback_positions`` of
the target's state groups (checked at admission).
"""

from __future__ import annotations

from collections.abc import Sequence

from speculant.speculative.proposal import Proposal
from speculant.workflow.state import DecodeState


class NgramIndex:
    """The latest start of every n-gram of a growing stream, ``n_min <= n <= n_max``, among
    the occurrences that end before the stream's last token; each query indexes only the
    tokens appended since the last (a request's stream only grows), so a round costs
    O(new tokens · n_max), not a scan of the context."""

    def __init__(self, n_min: int = 1, n_max: int = 3) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.latest: dict[int, dict[tuple[int, ...], int]] = {}  # n -> n-gram -> start
        self.length = 0  # the stream length indexed for

    def drafts(self, stream: Sequence[int], k: int, after: Sequence[int] = ()) -> list[int]:
        """Up to ``k`` tokens that followed the most recent earlier occurrence of the
        stream's last ``n`` tokens, trying ``n = n_max … n_min``; ``[]`` when none recurs.
        ``after``: tokens taken to follow the stream (drafted already), ended by the n-gram
        looked up; only the stream itself is indexed.

        The final n-gram itself (ending at the last token) is excluded, so an occurrence
        starts at most at ``len(stream) − n − 1`` and at least one token follows it;
        occurrences may overlap the final n-gram. ``stream`` is ``x[0..L)``, pending last.
        """
        length = len(stream)
        if length < self.length:  # another stream: start over
            self.latest, self.length = {}, 0
        for n in range(self.n_min, self.n_max + 1):  # starts s with s + n <= L - 1
            latest = self.latest.setdefault(n, {})
            for start in range(max(self.length - n, 0), length - n):
                latest[tuple(stream[start:start + n])] = start
        self.length = length
        if k < 1:
            return []
        tail = [*stream[max(length - self.n_max, 0):], *after][-self.n_max:]
        for n in range(min(self.n_max, length + len(after) - 1), self.n_min - 1, -1):
            start = self.latest[n].get(tuple(tail[len(tail) - n:]))
            if start is not None:  # the tokens after the most recent occurrence
                return [int(t) for t in stream[start + n:start + n + k]]
        return []


def lookup_drafts(stream: Sequence[int], k: int, n_max: int = 3, n_min: int = 1) -> list[int]:
    """:meth:`NgramIndex.drafts` of a fresh index: the rule on one stream."""
    return NgramIndex(n_min, n_max).drafts(stream, k)


class PromptLookupProposer:
    """Drafts by an :class:`NgramIndex` of the stream ``x[0..L)`` (one per request)."""

    def __init__(self, n_min: int = 1, n_max: int = 3) -> None:
        self.index = NgramIndex(n_min, n_max)

    def propose(self, state: DecodeState, k: int) -> Proposal:
        """Under a grammar: the tokens it forces, then the n-gram drafts after them, cut at
        the first the grammar refuses (workflow/constraint.py)."""
        constraint = state.constraint
        if constraint is None:
            return Proposal(self.index.drafts(state.tokens, k))
        forced = constraint.forced_tokens(k)
        drafts = forced + self.index.drafts(state.tokens, k - len(forced), after=forced)
        return Proposal(drafts[:constraint.num_valid(drafts)])
