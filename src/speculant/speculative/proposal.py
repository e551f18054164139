"""What a proposer returns, and the protocol every proposer kind follows (STYLE habit 5)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from speculant.tensors import Value
from speculant.workflow.state import DecodeState
from speculant.workflow.target_pass import PassResult


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
    # with `drafts`, where a round is queued behind another: [k_r + 1] int32, the pending
    # token (not known to the host yet) and the drafts, the block the target verifies
    block: Value | None = None

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


@dataclass(frozen=True)
class QueuedRound:
    """A round queued on the device and not read yet (speculative/ahead.py): what the round
    queued behind it starts from."""

    k: int  # drafts it verifies
    verify: PassResult  # its target pass (``start`` and ``tokens`` known once it is read)
    counted: Value  # [k + 2] int32 where the target ran: a, then c_1 … c_{k+1}
    read: Callable[[], list[int]]  # reads ``counted`` back (4 (k + 2) bytes)
    num_proposer_invocations: int = 0
    num_proposer_rows: int = 0
    is_queued: bool = False  # queued behind a round not read yet (the first is not)


class QueuingProposer(Proposer, Protocol):
    """A proposer whose rounds can be queued behind one another on the device."""

    def queues(self, state: DecodeState) -> bool:
        """Whether this decode's rounds can be queued (greedy, static caches, every input
        of the proposer advanced where it runs)."""
        ...

    def propose_after(self, state: DecodeState, after: QueuedRound | None, cursor: Value,
                      k: int) -> Proposal:
        """``k`` drafts (``k`` may be 0) for the round queued behind ``after``, whose start
        is ``cursor`` [1] int32 (``after`` None: behind the state's latest round, read),
        with ``Proposal.block`` [k + 1] int32: the pending token and the drafts."""
        ...
