"""k that picks itself (issue 12 item 5): ``k="auto"`` chooses each round's width from what
the runtime measures.

**The rule.** Before each proposal, for every width ``k`` in ``0 … K`` (``K`` = the kind's
default k, within its bound), with the measured

* ``p_i``: acceptance of the draft at block position ``i`` *given* the drafts before it were
  accepted (an exponential moving average per position, weight
  :data:`ACCEPTANCE_SMOOTHING` per round that reached the position, starting at
  :data:`PRIOR_ACCEPTANCE`);
* ``t_propose(k)``: seconds this proposer kind takes to propose ``k`` drafts: the wall clock
  around its ``propose``, or its runs' time where that is longer (the proposer's sessions
  are observed like the target's: a drafter chain queued on the device returns in its launch
  time, and its work is timed by marks on the stream, asked once finished); a chained
  drafter's bootstrap step makes it ``t_0 + k · t_step`` rather than ``k · t_draft``;
  ``t_propose(0) = 0``;
* ``t_verify(n)``: seconds of a target pass over ``n`` tokens (the target session's observer,
  so every run through ``invoke`` or a ``PassPlan`` counts);

each a moving average per width (:class:`WidthTable`; a width not measured yet is read off
the least-squares line through the measured widths, their mean where the line falls; never
below the cheapest measured, but below the narrowest measured width between its cost in
proportion to the tokens and its cost (priced as dear as it, narrower widths were never
tried: cold, SmolLM2's CPU pair stayed at k = 6); while one width is measured, flat for a
verify and in proportion to the drafts for a proposal (flat, a proposer first timed at its
widest width looked as dear at every width: SmolLM2's CPU chain stayed at k = 8);
:data:`UNMEASURED_SECONDS` for a verify and 0 for a proposal while none is); and

* ``t_round``: the seconds a round spends outside both (acceptance, read-back, rollback,
  commit, the bookkeeping: the wall clock from one proposal to the next, less the proposal
  (its work past its host time included) and the verify pass between them; a moving
  average, 0 until measured, an interval over :data:`STALL_SECONDS` not counted: a consumer
  that paused). It is paid once per round
  whatever the width — on the H200 it was larger than the verify pass itself — so leaving it
  out makes short widths look cheaper than they are. A greedy step's is its own
  (``t_round(0)``; the others' until measured): on 2 CPU cores 0.08 ms against a chained
  round's 0.2, and one figure for both made drafting look worth it where greedy won;

the round runs at the ``k`` that maximizes the expected committed tokens per second

    rate(k) = E[a | k] / (t_propose(k) + t_verify(k + 1) + t_round(k)),
    E[a | k] = 1 + Σ_{j≤k} Π_{i≤j} p_i

(``a``: tokens committed by the round, the correction or bonus included; ties go to the
smaller k). ``k = 0`` is a greedy step (drafting does not pay); after
:func:`probe_interval` greedy steps in a row (:data:`PROBE_EVERY`, more where a probe is dear
against a greedy step) the controller proposes one draft again. Until then its acceptance
cannot move, so the steps after a greedy choice run on the greedy path (speculative/ahead.py:
no proposal, no host argmax), up to :data:`STRETCH` before the rule is asked again (the costs
drift): as rounds they cost a quarter more than a greedy step on the CPU demo pair, where
95 % of k=auto's passes are greedy steps. After a round that
accepted every draft the next goes one position further (at most the bound), so the
acceptance it reads stays measured: a position the rule never reaches is never observed, and
its prior alone had kept SmolLM2's chain at k = 1 for whole requests. :func:`best_k` is that
rule as a pure function of its numbers: deterministic given them. The round is still exact:
the controller changes only the width, and every width is verified by the target (greedy
output stays bit for bit greedy; sampling stays distributed as the target's, though with
measured costs the draws depend on the widths chosen: fix ``k`` for draw-for-draw
reproducible sampling).

The anchors: Hugging Face transformers' ``num_assistant_tokens_schedule="heuristic"`` (+2
drafts after a full accept, −1 otherwise) adapts on acceptance alone; SGLang serves fixed
tiers (``speculative_num_steps``, ``speculative_num_draft_tokens``) chosen offline. This rule
uses both the acceptance and the measured cost of each width, online.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from speculant.session.session import Invocation, Observer
from speculant.speculative.proposal import Proposal, Proposer, QueuedRound
from speculant.tensors import Value
from speculant.workflow.state import DecodeState
from speculant.workflow.static_cells import StaticCells
from speculant.workflow.target_pass import TargetPass, capture_widths

AUTO = "auto"
SMOOTHING = 0.3  # weight of one new observation in a time's moving average
# ... and in an acceptance's: lower, as a short run of rejections is common and passes (on the
# H200 at 0.3, k=auto took a greedy step in 15-25 % of the realistic ~1B's passes, where the
# first draft is accepted 59 % of the time, and was 10 % slower than k=4);
# scripts/auto_k_sim.py replays the rule on acceptance with such runs
ACCEPTANCE_SMOOTHING = 0.15
SPIKE = 2.0  # a time over this multiple of its estimate is clipped to it
PRIOR_ACCEPTANCE = 0.6  # p_i before any round reached position i
UNMEASURED_SECONDS = 1.0  # t_verify while no pass was measured (flat: widths look free)
PROBE_EVERY = 8  # greedy steps in a row before one draft is proposed again, at least ...
PROBE_SHARE = 0.02  # ... and as many as keep a probe's extra cost to this share of them ...
MAX_PROBE_EVERY = 128  # ... up to this many
STRETCH = 8  # greedy steps run on the greedy path before the rule is asked again, at most
STALL_SECONDS = 0.25  # a round's outside time above this is a consumer's pause: not counted
UNSETTLED_MAX = 64  # observed target passes held before the older ones are folded in


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """E[a | k] = 1 + Σ_{j=1..k} Π_{i=1..j} p_i (tokens one round at width k commits)."""
    total, reach = 1.0, 1.0
    for p in acceptance[:k]:
        reach *= p
        total += reach
    return total


def best_k(acceptance: Sequence[float], propose_seconds: Sequence[float],
           verify_seconds: Sequence[float], round_seconds: float = 0.0,
           greedy_round_seconds: float | None = None) -> int:
    """The width in ``0 … len(acceptance)`` with the most expected tokens per second;
    ``propose_seconds[k]`` proposes ``k`` drafts, ``verify_seconds[n - 1]`` is a pass over
    ``n`` tokens (``len(acceptance) + 1`` entries each), ``round_seconds`` the rest of a
    round, paid at every width (``greedy_round_seconds`` at k = 0, where measured)."""
    best, best_rate = 0, -1.0
    for k in range(len(acceptance) + 1):
        outside = round_seconds if k or greedy_round_seconds is None else greedy_round_seconds
        seconds = (propose_seconds[k] if k else 0.0) + verify_seconds[k] + outside
        rate = expected_tokens(acceptance, k) / seconds if seconds > 0 else float("inf")
        if rate > best_rate:
            best, best_rate = k, rate
    return best


def probe_interval(propose_seconds: Sequence[float], verify_seconds: Sequence[float],
                   round_seconds: float, greedy_round_seconds: float | None) -> int:
    """Greedy steps in a row before a probe: as many as keep what a one-draft round costs
    beyond a greedy step under :data:`PROBE_SHARE` of them (on 2 CPU cores the demo pair's
    probes every 8 steps, with the rounds they led to, kept k=auto at 0.7× greedy)."""
    greedy_round = round_seconds if greedy_round_seconds is None else greedy_round_seconds
    greedy = verify_seconds[0] + greedy_round
    beyond = propose_seconds[1] + verify_seconds[1] + round_seconds - greedy
    if greedy <= 0 or beyond <= 0:
        return PROBE_EVERY
    return min(MAX_PROBE_EVERY, max(PROBE_EVERY, round(beyond / (PROBE_SHARE * greedy))))


def _moving(old: float | None, new: float, weight: float = SMOOTHING) -> float:
    return new if old is None else (1 - weight) * old + weight * new


def _moving_time(old: float | None, seconds: float) -> float:
    """:func:`_moving` for a time; one above :data:`SPIKE` × the estimate counts as that
    much (a run preempted on a shared host must not steer the next rounds)."""
    return _moving(old, seconds if old is None or old <= 0 else min(seconds, SPIKE * old))


@dataclass
class WidthTable:
    """Measured seconds by width (moving averages), and the widths not measured yet."""

    seconds: dict[int, float] = field(default_factory=dict)
    # one width measured: the others in proportion to it (a proposal's cost grows with its
    # drafts) rather than flat (a pass's, nearly flat on a device)
    proportional: bool = False
    # at()'s answers since the last observation (a greedy stretch leaves a proposer's
    # table as it was: its line is not fitted again every step)
    _answers: dict[tuple[range, float], tuple[float, ...]] = field(
        default_factory=dict, repr=False, compare=False)

    def observe(self, width: int, seconds: float) -> None:
        self.seconds[width] = _moving_time(self.seconds.get(width), seconds)
        self._answers.clear()

    def at(self, widths: range, unmeasured: float) -> list[float]:
        """Seconds at each of ``widths``: measured, else the fitted line (see the module)."""
        if (answer := self._answers.get((widths, unmeasured))) is None:
            answer = self._answers[widths, unmeasured] = tuple(self._fit(widths, unmeasured))
        return list(answer)

    def _fit(self, widths: range, unmeasured: float) -> list[float]:
        measured = sorted(self.seconds.items())
        if not measured:
            return [unmeasured] * len(widths)
        if len(measured) == 1:
            (width, seconds_at), = measured
            fitted = {n: seconds_at * n / width if self.proportional and width else seconds_at
                      for n in widths}
        else:  # a handful of points: the stdlib's least squares, microseconds a round
            points, seconds = zip(*measured, strict=True)
            slope, intercept = statistics.linear_regression(points, seconds)
            floor, mean = min(seconds), statistics.fmean(seconds)
            (narrowest, at_narrowest), line = measured[0], lambda n: intercept + slope * n
            fitted = {n: mean if slope <= 0 else max(floor, line(n)) if n > narrowest
                      else min(at_narrowest, max(at_narrowest * n / narrowest, line(n)))
                      for n in widths}
        return [self.seconds.get(n, fitted[n]) for n in widths]


@dataclass
class WidthCosts:
    """The engine's measured costs: a target pass per width, a proposal per kind and width."""

    verify: WidthTable = field(default_factory=WidthTable)  # n tokens -> seconds of a pass
    propose: dict[str, WidthTable] = field(default_factory=dict)  # kind -> k -> seconds
    round_seconds: float = 0.0  # t_round: a round's time outside its proposal and verify
    greedy_round_seconds: float | None = None  # t_round(0): a greedy step's (None: not yet)
    verified_seconds: float = 0.0  # the settled observed target passes' seconds, summed
    # (width or 0, call) of target passes observed, their seconds not asked yet: asking
    # an overlapped replay's waits for its end, so it waits until the round reads back
    unsettled: list[tuple[int, Invocation]] = field(default_factory=list)
    # runs of the proposer's sessions since the last proposal took them (timed like the
    # target's: marks on the stream where a replay is overlapped, so a drafter's work
    # queued on the device is priced by the device's time, not by its launch)
    proposer_runs: list[Invocation] = field(default_factory=list)
    # (kind, k, host seconds, its runs, whether timed) of proposals not folded in yet
    unsettled_proposals: list[tuple[str, int, float, list[Invocation], bool]] = field(
        default_factory=list)
    beyond_host_seconds: float = 0.0  # settled proposals' work time past their host time

    @property
    def verify_total(self) -> float:
        """Seconds of every observed target pass, summed (settles those observed)."""
        self.settle(keep=0)
        return self.verified_seconds

    def settle(self, keep: int) -> None:
        """Fold in every unsettled pass but the latest ``keep``, oldest first, up to the
        first still running (never waits: rounds queued behind one another keep passes
        in flight while the host chooses the next width)."""
        settled = self.unsettled[:len(self.unsettled) - keep]
        for num_done, (_, call) in enumerate(settled):
            if call.ready is not None and not call.ready():
                settled = settled[:num_done]
                break
        del self.unsettled[:len(settled)]
        for width, call in settled:
            seconds = call.seconds  # asked once, finished: no wait
            self.verified_seconds += seconds
            if width:
                self.verify.observe(width, seconds)

    def observe_round(self, seconds: float, width: int = 1) -> None:
        """A round of ``width`` drafts (0: a greedy step) spent ``seconds`` outside both."""
        if 0.0 <= seconds <= STALL_SECONDS and width:
            self.round_seconds = _moving_time(self.round_seconds or None, seconds)
        elif 0.0 <= seconds <= STALL_SECONDS:
            self.greedy_round_seconds = _moving_time(self.greedy_round_seconds, seconds)

    def verify_seconds(self, max_width: int) -> list[float]:
        """``t_verify(n)`` for ``n = 1 … max_width``."""
        self.settle(keep=0)
        return self.verify.at(range(1, max_width + 1), UNMEASURED_SECONDS)

    def propose_seconds(self, kind: str, max_k: int) -> list[float]:
        """``t_propose(k)`` for ``k = 0 … max_k`` (0 at k = 0)."""
        self.settle_proposals()
        table = self.propose.get(kind, WidthTable(proportional=True))
        return [0.0, *table.at(range(1, max_k + 1), 0.0)]

    def observe_proposal(self, kind: str, k: int, seconds: float) -> None:
        self.propose.setdefault(kind, WidthTable(proportional=True)).observe(k, seconds)

    def proposer_observer(self) -> Observer:
        """An observer for the proposer's sessions: each run belongs to the proposal being
        made (:meth:`add_proposal` takes them; a fixed k never does: the latest
        :data:`UNSETTLED_MAX` are kept)."""
        def observe(call: Invocation) -> None:
            self.proposer_runs.append(replace(call, inputs={}))
            if len(self.proposer_runs) > UNSETTLED_MAX:
                del self.proposer_runs[0]

        return observe

    def add_proposal(self, kind: str, k: int, host_seconds: float, timed: bool) -> None:
        """A proposal of ``k`` drafts made in ``host_seconds`` with the proposer runs observed
        since the last; its cost is the larger of its host time and its runs' time, known
        once they finished (:meth:`settle_proposals`); ``timed`` False: not a measurement
        (a width's first proposal in a request)."""
        runs, self.proposer_runs = self.proposer_runs, []
        self.unsettled_proposals.append((kind, k, host_seconds, runs, timed))

    def settle_proposals(self) -> float:
        """Settled proposals' work seconds past their host seconds, summed: folds in those
        whose runs finished, oldest first, up to the first still running (never waits)."""
        while self.unsettled_proposals:
            kind, k, host, runs, timed = self.unsettled_proposals[0]
            if any(run.ready is not None and not run.ready() for run in runs):
                break
            del self.unsettled_proposals[0]
            seconds = max(host, sum(run.seconds for run in runs))
            self.beyond_host_seconds += seconds - host
            if timed:
                self.observe_proposal(kind, k, seconds)
        return self.beyond_host_seconds

    def verify_observer(self, roles: Mapping[str, str], max_width: int = 64) -> Observer:
        """An observer for the target session: each run over ``n <= max_width`` tokens (the
        ``token_ids`` port's last axis) is a measurement of ``t_verify(n)``."""
        token_port = next((port for port, role in roles.items() if role == "token_ids"), None)

        def observe(call: Invocation) -> None:
            value = call.inputs.get(token_port) if token_port is not None else None
            width = int(value.shape[-1]) if value is not None and value.rank else 0
            # kept without its inputs (a request's own buffers must not outlive it)
            self.unsettled.append((width if 0 < width <= max_width else 0,
                                   replace(call, inputs={})))
            if len(self.unsettled) > UNSETTLED_MAX:  # greedy decodes never ask: bounded
                self.settle(keep=2)  # the older ones finished long ago

        return observe


@dataclass
class WidthController:
    """One request's acceptance by position and its choice of k (see the module)."""

    max_k: int
    acceptance: list[float] = field(default_factory=list)
    num_greedy_in_a_row: int = 0
    has_probed: bool = False  # the request's first probe at PROBE_EVERY, later ones priced
    reach: int = 0  # after a full accept at width k: k + 1, the next round's least width
    greedy_left: int = 0  # after a greedy choice: the greedy steps before the next probe

    def __post_init__(self) -> None:
        if not self.acceptance:
            self.acceptance = [PRIOR_ACCEPTANCE] * self.max_k

    def observe(self, k: int, num_accepted: int) -> None:
        """A round verified ``k`` drafts and committed ``num_accepted`` tokens (so
        ``num_accepted - 1`` drafts were accepted): positions ``1 … num_accepted - 1`` were
        accepted, position ``num_accepted`` (if ``<= k``) rejected, the rest not reached."""
        for i in range(min(k, num_accepted, self.max_k)):
            is_accepted = i < num_accepted - 1
            self.acceptance[i] = _moving(self.acceptance[i], 1.0 if is_accepted else 0.0,
                                         ACCEPTANCE_SMOOTHING)
        self.reach = min(k + 1, self.max_k) if num_accepted == k + 1 else 0

    def choose(self, costs: WidthCosts, kind: str) -> int:
        propose, verify = costs.propose_seconds(kind, self.max_k), costs.verify_seconds(
            self.max_k + 1)
        k = best_k(self.acceptance, propose, verify, costs.round_seconds,
                   costs.greedy_round_seconds)
        interval = probe_interval(propose, verify, costs.round_seconds,
                                  costs.greedy_round_seconds) if self.has_probed else \
            PROBE_EVERY  # the request's first probe early: its text may suit the drafter
        if k == 0 and self.num_greedy_in_a_row >= interval:
            k, self.has_probed = 1, True  # a probe: keep the acceptance measured
        k, self.reach = max(k, self.reach), 0  # one position past a full accept
        self.num_greedy_in_a_row = self.num_greedy_in_a_row + 1 if k == 0 else 0
        self.greedy_left = interval - self.num_greedy_in_a_row if k == 0 else 0
        return k

    def take_greedy_stretch(self, most: int) -> int:
        """After a greedy choice: up to ``most`` of the greedy steps before the next probe,
        counted as chosen (the rule, asked, would choose them: acceptance moves only in a
        round with drafts)."""
        steps = min(self.greedy_left, most)
        self.greedy_left -= steps
        self.num_greedy_in_a_row += steps
        return steps


class AutoWidthProposer:
    """A proposer at the width the controller picks each round (never above the round's
    cap; 0: no drafts, the round is a greedy step): it learns the last round's outcome from
    the decode's trace and times ``propose``."""

    def __init__(self, inner: Proposer, kind: str, controller: WidthController,
                 costs: WidthCosts) -> None:
        self.inner, self.kind, self.controller, self.costs = inner, kind, controller, costs
        self._num_rounds_seen = 0
        self.chosen: list[int] = []  # the width asked of the proposer, per proposal
        self._widths_proposed: set[int] = set()  # widths proposed in this request
        # when the last proposal (or greedy stretch) returned, its drafts, and the verify
        # seconds and the proposals' work seconds past their host's observed by then, and
        # the steps it stands for (a stretch's greedy steps, else 1)
        self._last: tuple[float, int, float, float, int] | None = None

    def capture_widths(self, state: DecodeState, target: TargetPass) -> None:
        """On CUDA graphs, once per static buffer set: the target's passes over ``1 … K + 1``
        tokens and the chain's plans of ``1 … K`` drafts captured (a capture mid-decode
        stalls it), then each timed (unmeasured widths looked free: seven drafts a round)."""
        cells = state.cells
        if not isinstance(cells, StaticCells) or not target.session.graphs.is_enabled or \
                all(n in cells.plans and not cells.plans[n].awaits_capture
                    for n in range(1, self.controller.max_k + 2)):
            return
        max_k = self.controller.max_k
        capture_widths(target, range(1, max_k + 2), state.pending, state.consumed, cells,
                       state.admitted, state.controls)
        if (inner := getattr(self.inner, "capture_widths", None)) is None:
            return
        inner(state, max_k)
        for k in range(1, max_k + 1) if state.sampler is None else ():  # draws none
            self._timed(lambda k=k: self.inner.propose(state, k), measured=True)
        self._last = None  # no round yet

    def propose(self, state: DecodeState, k: int) -> Proposal:
        width = self._choose(state, k)  # 0: drafting does not pay now, a greedy step
        return self._timed(lambda: self.inner.propose(state, width) if width else Proposal())

    def queues(self, state: DecodeState) -> bool:
        queues = getattr(self.inner, "queues", None)
        return queues is not None and queues(state)

    def propose_after(self, state: DecodeState, after: QueuedRound | None, cursor: Value,
                      k: int) -> Proposal:
        """A round queued behind another (speculative/ahead.py), at the width chosen from
        the rounds read so far (0 is a greedy step there too)."""
        width = self._choose(state, k)
        return self._timed(lambda: self.inner.propose_after(state, after, cursor, width))

    def greedy_stretch(self) -> int:
        """Greedy steps for the decode to run now on the greedy path, past the round just
        run (0: none; see the module): their time outside the passes, per step, is
        ``t_round(0)``'s next observation."""
        steps = self.controller.take_greedy_stretch(STRETCH)
        if steps:
            self._observe_last()
            self._last = (time.perf_counter(), 0, self.costs.verify_total,
                          self.costs.settle_proposals(), steps)
        return steps

    def _observe_last(self) -> None:
        """The last round's (or stretch's, per step) time outside its proposal and verify."""
        if self._last is not None:
            returned, width, verified, beyond, steps = self._last
            costs = self.costs
            costs.observe_round((time.perf_counter() - returned - (costs.verify_total - verified)
                                 - (costs.settle_proposals() - beyond)) / steps, width)
            self._last = None

    def _choose(self, state: DecodeState, k: int) -> int:
        self._observe_last()
        trace = state.stats.trace
        for round_k, num_accepted in trace[self._num_rounds_seen:]:
            self.controller.observe(round_k, num_accepted)
        self._num_rounds_seen = len(trace)
        width = min(k, self.controller.choose(self.costs, self.kind))
        self.chosen.append(width)
        return width

    def _timed(self, propose: Callable[[], Proposal], measured: bool = False) -> Proposal:
        costs = self.costs
        costs.proposer_runs.clear()  # runs before this proposal are not its own
        started = time.perf_counter()
        proposal = propose()
        proposing = time.perf_counter() - started
        # a width's first proposal in a request is not timed: it may make that width's plan
        # or session once; nor is a greedy step's empty one (t_propose(0) = 0)
        costs.add_proposal(self.kind, proposal.k, proposing, timed=proposal.k > 0 and (
            measured or proposal.k in self._widths_proposed))
        self._widths_proposed.add(proposal.k)
        self._last = (time.perf_counter(), proposal.k, costs.verify_total,
                      costs.settle_proposals(), 1)
        return proposal
