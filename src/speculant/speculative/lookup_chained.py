"""Prompt lookup or the chained drafter, whichever this request's own rounds say drafts
better here (kind ``lookup_chained``), chosen each round.

Each round has up to three sources: the continuation of the stream's last 2 or 3 tokens
where they occurred before (``lookup``), of its last token alone (``lookup1``: a weaker
signal, one token recurs by chance), and the chained drafter. :class:`SourceChoice` keeps,
per request, a moving average of the drafts each source gets accepted and drafts with the
best one available (ties to lookup: it runs no model). A lookup source is scored on every
round where it had a continuation, taken or not: the committed stream does not depend on
the drafts (greedy, or draws keyed by position), so its leading matches with the stream are
what the target would have accepted. The chained drafter is scored on its own rounds, from
how far the stream moved (``a − 1``) where exactly one target pass ran since.

The chained drafter keeps nothing between rounds (its carry seed and its context are the
target's latest pass: ``ChainedProposer.chain_context``), so a round it skips costs it
nothing. The choice reads only the committed stream, so the output is the target's as with
either proposer alone. Under a grammar the chained drafter drafts every round (its steps are
masked by the grammar: ``ChainedProposer._read_drafts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speculant.speculative.prompt_lookup import NgramIndex
from speculant.speculative.proposal import Proposal, Proposer, RowsProposer
from speculant.workflow.state import DecodeState

LOOKUP, LOOKUP1, CHAINED = "lookup", "lookup1", "chained"
# drafts accepted a round, before a request's own rounds: lookup as likely as the drafter,
# a single-token match rarely
PRIORS = {LOOKUP: 1.0, LOOKUP1: 0.3, CHAINED: 1.0}
WEIGHT = 0.3  # of the latest round in each moving average


@dataclass
class SourceChoice:
    """Per request: each source's moving average of accepted drafts and the rounds still to
    be scored. ``choose`` names the source for a round; ``settle`` scores what the stream
    has decided since."""

    accepted: dict[str, float] = field(default_factory=lambda: dict(PRIORS))
    # lookup continuations not yet scored: (stream length L at proposal, drafts, source)
    pending: list[tuple[int, list[int], str]] = field(default_factory=list)
    # the last chained round: (L, its drafts k_r, the target passes then)
    chained: tuple[int, int, int] | None = None
    rounds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PRIORS, 0))

    def settle(self, stream: list[int], passes: int) -> None:
        """Score every pending continuation the stream has decided (all of it, or up to its
        first mismatch), and the last chained round where one pass ran since."""
        length, kept = len(stream), []
        for start, drafts, source in self.pending:
            known = stream[start:start + len(drafts)]
            matched = 0
            while matched < len(known) and known[matched] == drafts[matched]:
                matched += 1
            if matched < len(known) or len(known) == len(drafts):
                self._observe(source, matched)
            else:
                kept.append((start, drafts, source))
        self.pending = kept
        if self.chained is not None:
            start, k, then = self.chained
            if passes == then + 1:
                self._observe(CHAINED, min(length - start - 1, k))
            self.chained = None

    def choose(self, candidates: dict[str, list[int]]) -> str:
        """The source of the highest average among ``candidates`` (their continuations;
        the chained drafter is always one), ties to the first of lookup, lookup1."""
        available = [s for s in (LOOKUP, LOOKUP1) if candidates.get(s)] + [CHAINED]
        return max(available, key=lambda s: self.accepted[s])

    def _observe(self, source: str, accepted: int) -> None:
        self.accepted[source] += WEIGHT * (accepted - self.accepted[source])


class LookupChainedProposer:
    """One request's proposer: n-gram indexes of its stream in front of the chained
    drafter — the engine's (batch 1) or the scheduler's chained rows (``rows``: the rows it
    does not draft itself are drafted with the step's other chained rows,
    scheduler._draft_rows). ``choice.rounds`` counts the rounds each source drafted."""

    def __init__(self, chained: Proposer, n_min: int = 1, n_max: int = 3) -> None:
        self.chained = chained
        self.long = NgramIndex(min(max(2, n_min), n_max), n_max)
        self.short = NgramIndex(1, 1) if n_min <= 1 else None
        self.choice = SourceChoice()

    @property
    def rows(self) -> RowsProposer:
        assert isinstance(self.chained, RowsProposer), "batch 1 drafts alone"
        return self.chained

    def propose_ahead(self, state: DecodeState, k: int) -> Proposal | None:
        """This round's lookup drafts where a lookup source is chosen, else None (the
        chained drafter drafts: :meth:`chained_proposed` is then due)."""
        stream = state.tokens
        self.choice.settle(stream, state.stats.target_passes)
        if state.constraint is not None or k < 1:
            return None
        candidates = {LOOKUP: self.long.drafts(stream, k)}
        if self.short is not None:
            candidates[LOOKUP1] = self.short.drafts(stream, k) if not candidates[LOOKUP] \
                else []
        for source, drafts in candidates.items():
            if drafts:
                self.choice.pending.append((len(stream), drafts, source))
        source = self.choice.choose(candidates)
        self.choice.rounds[source] += 1
        if source == CHAINED:
            self.choice.chained = (len(stream), k, state.stats.target_passes)
            return None
        return Proposal(candidates[source])

    def propose(self, state: DecodeState, k: int) -> Proposal:
        found = self.propose_ahead(state, k)
        if found is not None:
            return found
        proposal = self.chained.propose(state, k)
        if self.choice.chained is not None:  # the drafts it made, for scoring
            start, _, passes = self.choice.chained
            self.choice.chained = (start, proposal.k, passes)
        return proposal

    def capture_widths(self, state: DecodeState, widths: list[int]) -> None:
        """The chained drafter's plans of every width (decode.warm_up, CUDA graphs)."""
        self.chained.capture_widths(state, widths)
