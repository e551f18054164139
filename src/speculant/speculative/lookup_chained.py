"""Prompt lookup where the context repeats, the chained drafter elsewhere (kind
``lookup_chained``), chosen each round.

Where the stream's last ``n >= 2`` tokens occurred before, the tokens that followed them are
the round's drafts (:class:`NgramIndex`, no model run); otherwise the chained drafter drafts.
The chained drafter keeps nothing between rounds (its carry seed and its context are the
target's latest pass: ``ChainedProposer.chain_context``), so a round it skips costs it
nothing and the next round it drafts is the round it would have drafted. The choice depends
only on the committed stream, so the output is the target's as with either proposer alone:
greedy output equals greedy decoding, and under sampling each round's drafts carry their own
``q`` (lookup drafts none: ``δ_d``).

One n-gram match is a weak signal (it recurs by chance), so n starts at 2: copying a
prompt's passage (translation, summarisation, retrieval answers) matches 2- and 3-grams,
and free text rarely does. Under a grammar the chained drafter drafts every round (its steps
are masked by the grammar: ``ChainedProposer._read_drafts``).
"""

from __future__ import annotations

from speculant.speculative.prompt_lookup import NgramIndex
from speculant.speculative.proposal import Proposal, Proposer, RowsProposer
from speculant.workflow.state import DecodeState

MIN_MATCH = 2  # the shortest recurring n-gram whose continuation is drafted


class LookupChainedProposer:
    """One request's proposer: an :class:`NgramIndex` of its stream (n-grams of
    ``max(MIN_MATCH, n_min) … n_max`` tokens) in front of the chained drafter — the
    engine's (batch 1) or the scheduler's chained rows (``rows``: the rows it does not
    draft itself are drafted with the step's other chained rows, scheduler._draft_rows).
    ``lookup_rounds`` and ``chained_rounds`` count the rounds each drafted."""

    def __init__(self, chained: Proposer, n_min: int = 1, n_max: int = 3) -> None:
        self.chained = chained
        self.index = NgramIndex(min(max(MIN_MATCH, n_min), n_max), n_max)
        self.lookup_rounds = 0
        self.chained_rounds = 0

    @property
    def rows(self) -> RowsProposer:
        assert isinstance(self.chained, RowsProposer), "batch 1 drafts alone"
        return self.chained

    def propose_ahead(self, state: DecodeState, k: int) -> Proposal | None:
        """The lookup drafts where a 2- or 3-gram recurs (not under a grammar), else None;
        None counts a round of the chained drafter."""
        if state.constraint is None and k > 0:
            drafts = self.index.drafts(state.tokens, k)
            if drafts:
                self.lookup_rounds += 1
                return Proposal(drafts)
        self.chained_rounds += 1
        return None

    def propose(self, state: DecodeState, k: int) -> Proposal:
        found = self.propose_ahead(state, k)
        return found if found is not None else self.chained.propose(state, k)

    def capture_widths(self, state: DecodeState, widths: list[int]) -> None:
        """The chained drafter's plans of every width (decode.warm_up, CUDA graphs)."""
        self.chained.capture_widths(state, widths)
