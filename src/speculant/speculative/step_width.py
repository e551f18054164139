"""How wide a scheduler step drafts, by load: ``k="auto"`` for requests decoded together
(speculative/scheduler.py; the rule, its terms and why: docs/design/batching.md, "k by load").

A step runs one batched pass ``[B, W]``; every row pays for ``W`` whatever it drafts. So the
step's width is chosen once, for all its ``k="auto"`` rows (:class:`RowWidth`), from the
scheduler's own measured costs (:class:`StepCosts`: a pass per ``(n, W)``, ``n`` the rows it
computes; a row's proposal per kind and ``k``, and the rows' drafted together per kind and
widest ``k``; a step's time outside them per ``B``, the rows in it) and each row's
acceptance by position: the ``W`` with the most expected committed tokens per second of the
step. Every width is verified by the target, so the choice never changes greedy output.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from speculant.speculative.proposal import Proposer, RowsProposer
from speculant.speculative.width import (
    PRIOR_ACCEPTANCE,
    UNMEASURED_SECONDS,
    MeasuredWidth,
    WidthController,
    WidthPolicy,
    WidthTable,
    probe_interval,
)
from speculant.workflow.state import DecodeState, RoundResult

EXPLORE_EVERY = 4  # steps at least between two explorations of a width the rule did not pick
STALE_STEPS = 64  # a pass cost older than this many steps is explored again, and replaced


@dataclass(frozen=True)
class StepRows:
    """A step's ``k="auto"`` rows as the rule sees them."""

    tokens: np.ndarray  # [B, K + 1] float64: each row's E[a | k], k = 0 … its own max_k
    caps: np.ndarray  # [B] int64: the most drafts each row may verify this step
    propose_seconds: np.ndarray  # [B, K + 1] float64: each row's t_propose(k), k = 0 … K
    # rows drafted together: per group, its widest cap and t_propose_rows(k), k = 0 … cap
    groups: tuple[tuple[int, Sequence[float]], ...] = ()

    @classmethod
    def of(cls, rows: Sequence[tuple[Sequence[float], int, Sequence[float]]],
           groups: Sequence[tuple[int, Sequence[float]]] = ()) -> StepRows:
        """From each row's acceptance by position (``p_1 … p_K``), its cap and its
        ``t_propose(0 … cap)``: ``E[a | k] = Σ_{j≤k} Π_{i≤j} p_i`` (the empty product 1)."""
        widest = max((len(acceptance) for acceptance, _, _ in rows), default=0)
        factors = np.ones((len(rows), widest + 1))  # [B, K + 1]: 1, p_1 … p_K
        proposing = np.zeros((len(rows), widest + 1))
        for b, (acceptance, cap, seconds) in enumerate(rows):
            factors[b, 1:len(acceptance) + 1] = acceptance
            proposing[b, :cap + 1] = seconds[:cap + 1]
        return cls(np.cumsum(np.cumprod(factors, axis=1), axis=1),
                   np.array([cap for _, cap, _ in rows], np.int64), proposing, tuple(groups))

    def totals(self, widths: range) -> tuple[np.ndarray, np.ndarray]:
        """For each ``W`` of ``widths``, with ``k_b(W) = min(cap_b, W − 1)`` (a row drafts
        as far as the step's block reaches): ``Σ_b E_b[a | k_b(W)]`` and
        ``Σ_b t_propose_b(k_b(W)) + Σ_g t_propose_rows_g(min(cap_g, W − 1))`` (a group
        drafts as far as its widest row), ``[len(widths)]`` float64 each."""
        row, ks = np.arange(len(self.caps))[:, None], np.arange(widths.start - 1, widths.stop - 1)
        drafts = np.minimum(ks[None], self.caps[:, None])  # [B, len(widths)]: k_b(W)
        proposing = self.propose_seconds[row, drafts].sum(0)
        for cap, seconds in self.groups:
            proposing += np.asarray(seconds)[np.minimum(ks, cap)]
        return self.tokens[row, drafts].sum(0), proposing


def step_rates(rows: StepRows, widths: range, pass_seconds: Sequence[float],
               outside_seconds: float) -> np.ndarray:
    """Expected committed tokens per second of a step at each of ``widths``,
    ``Σ_b E_b[a | k_b] / (t_pass(B, W) + Σ_b t_propose_b(k_b) + t_outside(B))``;
    ``pass_seconds[i]`` is ``widths[i]``'s pass. ``[len(widths)]`` float64."""
    tokens, proposing = rows.totals(widths)
    seconds = np.asarray(pass_seconds, np.float64) + outside_seconds + proposing
    return np.where(seconds > 0, tokens / np.where(seconds > 0, seconds, 1.0), np.inf)


def best_width(rows: StepRows, widths: range, pass_seconds: Sequence[float],
               outside_seconds: float) -> int:
    """The width of ``widths`` with the highest :func:`step_rates`; ties go to the
    narrower."""
    return widths[int(np.argmax(step_rates(rows, widths, pass_seconds, outside_seconds)))]


@dataclass
class StepCosts:
    """The scheduler's measured costs (moving averages, as :class:`WidthTable`'s)."""

    passes: dict[int, WidthTable] = field(default_factory=dict)  # n rows run -> W -> seconds
    propose: dict[str, WidthTable] = field(default_factory=dict)  # kind -> k -> seconds
    # kind -> the widest k -> seconds of drafting the step's rows together (RowsProposer)
    propose_rows: dict[str, WidthTable] = field(default_factory=dict)
    outside: WidthTable = field(default_factory=WidthTable)  # B -> a step's other seconds

    # (n, W) -> the step its pass was last measured at (StepWidth's count)
    observed_at: dict[tuple[int, int], int] = field(default_factory=dict)

    def observe_pass(self, num_rows: int, width: int, seconds: float, step: int = 0) -> None:
        """Averaged in, or replacing a stale cost (the buffers grew, the host was busy)."""
        table = self.passes.setdefault(num_rows, WidthTable())
        if not self.is_measured(num_rows, width, step):
            table.seconds.pop(width, None)
        table.observe(width, seconds)
        self.observed_at[num_rows, width] = step

    def observe_proposal(self, kind: str, k: int, seconds: float, *,
                         is_together: bool = False) -> None:
        tables = self.propose_rows if is_together else self.propose
        tables.setdefault(kind, WidthTable(proportional=True)).observe(k, seconds)

    def observe_outside(self, num_rows: int, seconds: float) -> None:
        if seconds >= 0.0:
            self.outside.observe(num_rows, seconds)

    def is_measured(self, num_rows: int, width: int, step: int | None = None) -> bool:
        """Measured (given ``step``: at most :data:`STALE_STEPS` steps before it)."""
        table = self.passes.get(num_rows)
        return table is not None and width in table.seconds and (step is None or step - (
            self.observed_at.get((num_rows, width), step)) <= STALE_STEPS)

    def lower_bound(self, num_rows: int, width: int, *, own: bool = True) -> float:
        """The least a pass ``[num_rows, width]`` can cost: a pass of no more rows and no
        wider costs no more (0 where none was measured; ``own`` False: its own left out)."""
        return max((seconds for rows, table in self.passes.items() if rows <= num_rows
                    for w, seconds in table.seconds.items() if w <= width and (
                        own or (rows, w) != (num_rows, width))), default=0.0)

    def pass_seconds(self, num_rows: int, widths: range) -> list[float]:
        """``t_pass(B, W)`` for each of ``widths``: measured, else read off the line through
        the widths measured at ``B`` (else at the nearest measured ``B``, the fewer rows on
        a tie), never below :meth:`lower_bound`, measured or not (a wider pass measured
        cheaper than a narrower one is noise); :data:`UNMEASURED_SECONDS` where no pass
        was measured (every width looks alike: the widest is run, and so measured)."""
        if not self.passes:
            return [UNMEASURED_SECONDS] * len(widths)
        nearest = min(self.passes, key=lambda rows: (abs(rows - num_rows), rows))
        fitted = self.passes[nearest].at(widths, UNMEASURED_SECONDS)
        return [max(fitted[i], self.lower_bound(num_rows, width))
                for i, width in enumerate(widths)]

    def propose_seconds(self, kind: str, cap: int, *, is_together: bool = False
                        ) -> list[float]:
        """``t_propose(k)`` (``is_together``: ``t_propose_rows(k)``) for ``k = 0 … cap``
        (0 at k = 0; 0 where never measured)."""
        tables = self.propose_rows if is_together else self.propose
        table = tables.get(kind, WidthTable(proportional=True))
        return [0.0, *table.at(range(1, cap + 1), 0.0)]


class StepWidth:
    """Chooses each step's width for the scheduler's ``k="auto"`` rows and measures what
    the choice needs. :meth:`choose` before the step's launches (each row's
    :class:`RowWidth` then drafts ``min(cap, k)``), :meth:`observe_step` after its reads.

    Invariant: every width the rule compares it has a cost for; a width priced by
    estimate is run before it is trusted — the chosen one at once, one the rule did not
    pick but might under its :meth:`StepCosts.lower_bound` once per
    :data:`EXPLORE_EVERY` steps — so each ``(n, W)`` is explored a bounded number of times.
    """

    def __init__(self, costs: StepCosts | None = None) -> None:
        self.costs = costs if costs is not None else StepCosts()
        self.k = 0  # the step's drafts per row, at most (W - 1)
        self.num_greedy_steps = 0  # steps in a row at W = 1 where a row could draft
        self.num_steps = 0
        self._explored_at = -EXPLORE_EVERY  # the step of the last exploration
        self._proposing_seconds = 0.0  # this step's RowWidth proposals, summed
        self._drafted_together: set[tuple[str, int]] = set()  # (kind, k) run: timed now
        # kind -> the acceptance by position of every row of that kind, pooled: a new
        # row's prior (not PRIOR_ACCEPTANCE: a row starting optimistic widens the step
        # until its own rounds correct it, and rows keep joining)
        self.pooled: dict[str, WidthController] = {}

    def row_policy(self, policy: WidthPolicy) -> WidthPolicy:
        """The policy a request decodes with here: ``k="auto"`` (a :class:`MeasuredWidth`,
        made for batch 1) becomes a :class:`RowWidth` of this step; a fixed k stays."""
        if isinstance(policy, MeasuredWidth):
            row = RowWidth(policy.controller.max_k, policy.kind, self)
            if (pooled := self.pooled.get(policy.kind)) is not None:
                known = pooled.acceptance[:row.controller.max_k]
                row.controller.acceptance[:len(known)] = known
            return row
        return policy

    def observed(self, kind: str, max_k: int, asked: int, num_accepted: int) -> None:
        """A ``kind`` row's round: ``asked`` drafts, ``num_accepted`` committed."""
        pooled = self.pooled.setdefault(kind, WidthController(max_k))
        if max_k > pooled.max_k:
            pooled.acceptance += [PRIOR_ACCEPTANCE] * (max_k - pooled.max_k)
            pooled.max_k = max_k
        pooled.observe(asked, num_accepted)

    def choose(self, rows: Sequence[tuple[WidthPolicy, int, Proposer | None]],
               num_run: int) -> int:
        """The step's width ``W`` for the decoding ``rows`` (each its policy, its cap and its
        proposer), its pass running ``num_run`` rows of the buffers; sets :attr:`k` to
        ``W − 1``. Fixed rows only bound ``W`` from below."""
        self.num_steps += 1
        self._proposing_seconds = 0.0
        costs = self.costs
        auto = [(policy, cap, isinstance(proposer, RowsProposer))
                for policy, cap, proposer in rows if isinstance(policy, RowWidth)]
        proposing: dict[tuple[str, int], list[float]] = {}  # (kind, cap) -> t_propose(k)
        together: dict[str, int] = {}  # kind -> its rows' widest cap
        for policy, cap, is_together in auto:
            if (policy.kind, cap) not in proposing:
                proposing[policy.kind, cap] = costs.propose_seconds(policy.kind, cap)
            if is_together:
                together[policy.kind] = max(cap, together.get(policy.kind, 0))
        steps = StepRows.of([(policy.controller.acceptance, cap, proposing[policy.kind, cap])
                             for policy, cap, _ in auto],
                            [(cap, costs.propose_seconds(kind, cap, is_together=True))
                             for kind, cap in together.items()])
        narrowest = 1 + max((min(policy.widths[-1], cap) for policy, cap, _ in rows
                             if not isinstance(policy, RowWidth)), default=0)
        widths = range(narrowest, 1 + max([narrowest - 1, *steps.caps.tolist()]) + 1)
        outside = costs.outside.seconds.get(len(rows), 0.0)
        seconds = costs.pass_seconds(num_run, widths)
        width = best_width(steps, widths, seconds, outside)
        if costs.is_measured(num_run, width):
            width = self._explore(steps, num_run, widths, width, seconds, outside)
        if width == 1 and steps.caps.any():
            width = self._probe(steps, num_run, outside)
        else:
            self.num_greedy_steps = 0
        self.k = width - 1
        return width

    def _explore(self, rows: StepRows, num_rows: int, widths: range, chosen: int,
                 seconds: Sequence[float], outside: float) -> int:
        """``chosen``, or (once per :data:`EXPLORE_EVERY` steps) the narrowest width
        unmeasured or measured :data:`STALE_STEPS` ago that would beat it at its lower
        bound (a slow first measurement is not kept for good)."""
        costs = self.costs
        known = [costs.is_measured(num_rows, width, self.num_steps) for width in widths]
        if self.num_steps - self._explored_at < EXPLORE_EVERY or all(known):
            return chosen
        rate = step_rates(rows, widths, seconds, outside)[widths.index(chosen)]
        optimistic = step_rates(rows, widths, [
            float("inf") if is_known else costs.lower_bound(num_rows, width, own=False)
            for width, is_known in zip(widths, known, strict=True)], outside)
        better = [width for width, best in zip(widths, optimistic, strict=True) if best > rate]
        if not better:
            return chosen
        self._explored_at = self.num_steps
        return better[0]

    def _probe(self, rows: StepRows, num_rows: int, outside: float) -> int:
        """1 (a greedy step), or 2 (one draft per row: acceptance stays measured) after as
        many greedy steps as keep a probe's extra cost to PROBE_SHARE of them."""
        self.num_greedy_steps += 1
        verify = self.costs.pass_seconds(num_rows, range(1, 3))
        propose = rows.totals(range(1, 3))[1].tolist()  # every row at k = 0, then k <= 1
        if self.num_greedy_steps < probe_interval(propose, verify, outside, None):
            return 1
        self.num_greedy_steps = 0
        return 2

    def proposed(self, kind: str, k: int, seconds: float, is_timed: bool) -> None:
        """A row's proposal of ``k`` drafts took ``seconds`` (``is_timed`` False: not a
        measurement, as a width's first proposal in a request)."""
        self._proposing_seconds += seconds
        if is_timed:
            self.costs.observe_proposal(kind, k, seconds)

    def drafted_together(self, rows: Sequence[tuple[WidthPolicy, int]],
                         seconds: float) -> None:
        """The step's rows of a :class:`RowsProposer` (each its policy and its k) were
        drafted together in ``seconds``: ``t_propose_rows(kind, widest k)`` where they are
        all ``k="auto"`` rows of one kind (a (kind, k)'s first run is not timed)."""
        kinds = {policy.kind if isinstance(policy, RowWidth) else None for policy, _ in rows}
        if not rows or len(kinds) != 1 or None in kinds:
            return
        self._proposing_seconds += seconds
        key = (kinds.pop(), max(k for _, k in rows))
        if key in self._drafted_together:
            self.costs.observe_proposal(*key, seconds, is_together=True)
        self._drafted_together.add(key)

    def observe_step(self, num_rows: int, num_run: int, width: int,
                     pass_seconds: float | None, step_seconds: float,
                     is_decoding: bool) -> None:
        """A step of ``num_rows`` rows ran a pass of ``num_run`` rows and ``width`` in
        ``pass_seconds`` (None: not a measurement — its plan was made in it) and took
        ``step_seconds`` from its choice to its last read; only a step that decoded prices
        the time outside."""
        if pass_seconds is None:
            return
        self.costs.observe_pass(num_run, width, pass_seconds, self.num_steps)
        if is_decoding:
            self.costs.observe_outside(num_rows, step_seconds - pass_seconds
                                       - self._proposing_seconds)


class RowWidth:
    """``k="auto"`` for one request decoded with others: its acceptance by position (a
    :class:`WidthController`'s, observed as alone), its width the step's (:class:`StepWidth`
    chooses it for every such row at once)."""

    def __init__(self, max_k: int, kind: str, step: StepWidth) -> None:
        self.controller = WidthController(max_k)
        self.kind, self.step = kind, step
        self.widths = range(0, max_k + 1)
        self.asked = 0  # the drafts this step's width gave the row, proposed or not
        self._widths_proposed: set[int] = set()  # a width's first proposal: not timed

    def width(self, state: DecodeState, cap: int) -> int:
        self.asked = min(cap, self.step.k)
        return self.asked

    def proposed(self, k: int, seconds: float) -> None:
        self.step.proposed(self.kind, k, seconds, is_timed=k > 0 and k in self._widths_proposed)
        self._widths_proposed.add(k)

    def observe(self, result: RoundResult) -> None:
        """The round's acceptance over the drafts the step asked for: a draft the proposer
        did not make (prompt lookup without a match) counts as rejected at its position,
        since the pass paid for it all the same."""
        if asked := max(result.k, self.asked):
            self.controller.observe(asked, result.num_accepted)
            self.step.observed(self.kind, self.controller.max_k, asked, result.num_accepted)
        self.asked = 0

    @contextmanager
    def measuring(self) -> Iterator[None]:
        yield
