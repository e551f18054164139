"""What a proposer returns, and the protocol every proposer kind follows (STYLE habit 5)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from speculant.errors import SpeculantError
from speculant.tensors import Value
from speculant.workflow.state import DecodeState, RoundResult
from speculant.workflow.target_pass import PassResult


@dataclass(frozen=True)
class Proposal:
    """Drafts for block positions ``1 … k_r`` and, under rejection sampling, what they were
    drawn from.

    ``probs`` is None for deterministic drafts (prompt lookup, or any proposer under greedy
    decoding; under rejection sampling the verifier takes ``q = δ_d``), and for drafts drawn
    with keyed noise (the verifier compares them with the target's own draws). Otherwise
    ``probs[i]`` is the distribution ``q_{i+1} = T(proposer row)`` [1, V] float32 that
    ``tokens[i]`` was drawn from, where the proposer's row lives.
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


NO_DRAFTS = Proposal()


class Proposer(Protocol):
    """Proposes drafts; never touches the target's caches or the stream (only the decode
    state does). May propose fewer than ``k`` drafts, or none (the round is a greedy step)."""

    def propose(self, state: DecodeState, k: int) -> Proposal:
        """At most ``k`` drafts following the pending token ``state.tokens[-1]``; sampled
        from ``T(row)`` when ``state.sampler`` is set (keyed: draft ``i`` with the noise of
        sequence position ``state.consumed + i``, workflow/sampler.py)."""
        ...


@runtime_checkable
class RowsProposer(Protocol):
    """A proposer that drafts the rows of a scheduler step together (one run per draft for
    all of them: the chained drafter, speculative/chain_rows.py; the draft model,
    speculative/draft_rows.py)."""

    def propose(self, state: DecodeState, k: int) -> Proposal: ...

    def propose_rows(self, requests: Sequence[tuple[DecodeState, int]]
                     ) -> list[Proposal | SpeculantError]:
        """Each ``(state, k)``'s drafts (``k >= 1``), or the error that ended its proposal
        alone; an error of the whole run is raised."""
        ...


@runtime_checkable
class RowsFallback(Protocol):
    """A proposer that drafts a row itself where it can and leaves the others to
    :attr:`rows`, which drafts them with the step's other rows (lookup_chained.py)."""

    rows: RowsProposer

    def propose(self, state: DecodeState, k: int) -> Proposal: ...

    def propose_ahead(self, state: DecodeState, k: int) -> Proposal | None:
        """Its own drafts for this row, or None: :attr:`rows` drafts it."""
        ...


HOST_ROUNDS, STEPS, QUEUED_ROUNDS = "host", "step", "queued"  # how a round is launched


@dataclass(frozen=True)
class LaunchedRound:
    """A round whose target pass is queued; :attr:`read` returns what it did."""

    how: str  # HOST_ROUNDS, STEPS or QUEUED_ROUNDS
    k: int  # drafts it verifies
    read: Callable[[], RoundResult]  # reads its outcome back (waits for its pass alone)
    verify: PassResult | None = None  # its target pass as launched (queued rounds)
    counted: Value | None = None  # [k + 2] int32 a, c_1 … c_{k+1}, where it ran (queued)
    choice: Value | None = None  # [1] int32 a step's argmax, where it ran


class QueuingProposer(Proposer, Protocol):
    """A proposer whose rounds can be queued behind one another on the device."""

    def can_queue(self, state: DecodeState) -> bool:
        """Whether this decode's rounds can be queued (greedy, static caches, every input
        of the proposer advanced where it runs)."""
        ...

    def propose_after(self, state: DecodeState, after: LaunchedRound | None, cursor: Value,
                      k: int) -> Proposal:
        """``k`` drafts (``k`` may be 0) for the round queued behind ``after``, whose start
        is ``cursor`` [1] int32 (``after`` None: behind the state's latest round, read),
        with ``Proposal.block`` [k + 1] int32: the pending token and the drafts."""
        ...
