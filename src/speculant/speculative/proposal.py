"""What a proposer returns, and the protocol every proposer kind follows (STYLE habit 5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from speculant.tensors import Value
from speculant.workflow.state import DecodeState


@dataclass(frozen=True)
class Proposal:
    """Drafts for block positions ``1 … k_r`` and, when sampling, what they were drawn from.

    ``probs`` is None for deterministic drafts (prompt lookup, or any proposer under greedy
    decoding): the verifier then takes ``q = δ_d``. Otherwise ``probs[i]`` is the
    distribution ``q_{i+1} = T(proposer row)`` [1, V] float32 that ``tokens[i]`` was drawn
    from, where the proposer's row lives.
    """

    tokens: list[int] = field(default_factory=list)  # the drafts d_1 … d_k_r
    probs: list[Value] | None = None
    num_invocations: int = 0  # proposer model runs it took (0 for prompt lookup)
    num_scored_rows: int = 0  # score rows it reduced to a token (argmax or a draw)
    # the drafts [k_r] int32 where the proposer made them, never read back (then `tokens`
    # is empty): the round verifies them in place (speculative/verify.py)
    drafts: Value | None = None

    @property
    def k(self) -> int:
        return len(self.tokens) if self.drafts is None else self.drafts.size


class Proposer(Protocol):
    """Proposes drafts; never touches the target's caches or the stream (only the decode
    state does). May propose fewer than ``k`` drafts, or none (the round is a greedy step)."""

    def propose(self, state: DecodeState, k: int) -> Proposal:
        """At most ``k`` drafts following the pending token ``state.tokens[-1]``; sampled
        from ``T(row)`` when ``state.sampler`` is set."""
        ...
