"""k that picks itself (issue 12 item 5): ``k="auto"`` chooses each round's width from what
the runtime measures.

**The rule.** Before each proposal, for every width ``k`` in ``1 … K`` (``K`` = the kind's
default k, within its bound), with the measured

* ``p_i``: acceptance of the draft at block position ``i`` *given* the drafts before it were
  accepted (an exponential moving average per position, weight :data:`SMOOTHING` per round
  that reached the position, starting at :data:`PRIOR_ACCEPTANCE`);
* ``t_draft``: seconds per draft of this proposer kind (the wall clock around its
  ``propose``, over the drafts it returned; moving average);
* ``t_verify(n)``: seconds of a target pass over ``n`` tokens (the target session's observer,
  so every run through ``invoke`` or a ``PassPlan`` counts; moving average per width; a width
  not measured yet is read off the least-squares line through the measured widths (never
  below the cheapest measured; their mean where the line falls), flat while one width is
  measured, :data:`UNMEASURED_SECONDS` while none is),

the round runs at the ``k`` that maximizes the expected committed tokens per second

    rate(k) = E[a | k] / (k · t_draft + t_verify(k + 1)),   E[a | k] = 1 + Σ_{j≤k} Π_{i≤j} p_i

(``a``: tokens committed by the round, the correction or bonus included; ties go to the
smaller k). :func:`best_k` is that rule as a pure function of its numbers: deterministic given
them. The round is still exact: the controller changes only the width, and every width is
verified by the target (greedy output stays bit for bit greedy; sampling stays distributed as
the target's, though the draws themselves depend on the widths chosen).

The anchors: Hugging Face transformers' ``num_assistant_tokens_schedule="heuristic"`` (+2
drafts after a full accept, −1 otherwise) adapts on acceptance alone; SGLang serves fixed
tiers (``speculative_num_steps``, ``speculative_num_draft_tokens``) chosen offline. This rule
uses both the acceptance and the measured cost of each width, online.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from speculant.session.session import Invocation, Observer
from speculant.speculative.proposal import Proposal, Proposer
from speculant.workflow.state import DecodeState

AUTO = "auto"
SMOOTHING = 0.3  # weight of one new observation in every moving average
PRIOR_ACCEPTANCE = 0.6  # p_i before any round reached position i
UNMEASURED_SECONDS = 1.0  # t_verify while no pass was measured (flat: widths look free)


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """E[a | k] = 1 + Σ_{j=1..k} Π_{i=1..j} p_i (tokens one round at width k commits)."""
    total, reach = 1.0, 1.0
    for p in acceptance[:k]:
        reach *= p
        total += reach
    return total


def best_k(acceptance: Sequence[float], draft_seconds: float,
           verify_seconds: Sequence[float]) -> int:
    """The width in ``1 … len(acceptance)`` with the most expected tokens per second;
    ``verify_seconds[n - 1]`` is a pass over ``n`` tokens (``len(acceptance) + 1`` entries)."""
    best, best_rate = 1, -1.0
    for k in range(1, len(acceptance) + 1):
        seconds = k * draft_seconds + verify_seconds[k]
        rate = expected_tokens(acceptance, k) / seconds if seconds > 0 else float("inf")
        if rate > best_rate:
            best, best_rate = k, rate
    return best


def _moving(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


@dataclass
class WidthCosts:
    """The engine's measured costs: a target pass per width, a draft per proposer kind."""

    verify: dict[int, float] = field(default_factory=dict)  # n -> seconds of a pass over n
    draft: dict[str, float] = field(default_factory=dict)  # kind -> seconds per draft

    def observe_verify(self, width: int, seconds: float) -> None:
        self.verify[width] = _moving(self.verify.get(width), seconds)

    def observe_draft(self, kind: str, seconds_per_draft: float) -> None:
        self.draft[kind] = _moving(self.draft.get(kind), seconds_per_draft)

    def verify_seconds(self, max_width: int) -> list[float]:
        """``t_verify(n)`` for ``n = 1 … max_width``: measured, else the fitted line."""
        measured = sorted(self.verify.items())
        if not measured:
            return [UNMEASURED_SECONDS] * max_width
        if len(measured) == 1:
            fitted = [measured[0][1]] * max_width
        else:
            widths, seconds = np.array(measured, dtype=np.float64).T
            slope, intercept = np.polyfit(widths, seconds, 1)
            floor = float(seconds.min())
            fitted = ([max(floor, float(intercept + slope * n)) for n in range(1, max_width + 1)]
                      if slope > 0 else [float(seconds.mean())] * max_width)
        return [self.verify.get(n, fitted[n - 1]) for n in range(1, max_width + 1)]

    def verify_observer(self, roles: Mapping[str, str], max_width: int = 64) -> Observer:
        """An observer for the target session: each run over ``n <= max_width`` tokens (the
        ``token_ids`` port's last axis) is a measurement of ``t_verify(n)``."""
        token_port = next((port for port, role in roles.items() if role == "token_ids"), None)

        def observe(call: Invocation) -> None:
            value = call.inputs.get(token_port) if token_port is not None else None
            if value is not None and value.rank and 0 < value.shape[-1] <= max_width:
                self.observe_verify(int(value.shape[-1]), call.seconds)

        return observe


@dataclass
class WidthController:
    """One request's acceptance by position and its choice of k (see the module)."""

    max_k: int
    acceptance: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.acceptance:
            self.acceptance = [PRIOR_ACCEPTANCE] * self.max_k

    def observe(self, k: int, num_accepted: int) -> None:
        """A round verified ``k`` drafts and committed ``num_accepted`` tokens (so
        ``num_accepted - 1`` drafts were accepted): positions ``1 … num_accepted - 1`` were
        accepted, position ``num_accepted`` (if ``<= k``) rejected, the rest not reached."""
        for i in range(min(k, num_accepted, self.max_k)):
            is_accepted = i < num_accepted - 1
            self.acceptance[i] = _moving(self.acceptance[i], 1.0 if is_accepted else 0.0)

    def choose(self, costs: WidthCosts, kind: str) -> int:
        return best_k(self.acceptance, costs.draft.get(kind, 0.0),
                      costs.verify_seconds(self.max_k + 1))


class AutoWidthProposer:
    """A proposer at the width the controller picks each round (never above the round's
    cap): it learns the last round's outcome from the decode's trace, times ``propose``."""

    def __init__(self, inner: Proposer, kind: str, controller: WidthController,
                 costs: WidthCosts) -> None:
        self.inner, self.kind, self.controller, self.costs = inner, kind, controller, costs
        self._num_rounds_seen = 0
        self.chosen: list[int] = []  # the width asked of the proposer, per proposal

    def propose(self, state: DecodeState, k: int) -> Proposal:
        trace = state.stats.trace
        for round_k, num_accepted in trace[self._num_rounds_seen:]:
            self.controller.observe(round_k, num_accepted)
        self._num_rounds_seen = len(trace)
        width = min(k, self.controller.choose(self.costs, self.kind))
        self.chosen.append(width)
        started = time.perf_counter()
        proposal = self.inner.propose(state, width)
        if proposal.k:
            self.costs.observe_draft(self.kind, (time.perf_counter() - started) / proposal.k)
        return proposal
