"""How wide each round drafts: a :class:`WidthPolicy`, passed to the decode beside the proposer.

:class:`FixedWidth` (a fixed ``k``: the null object) and :class:`MeasuredWidth` (``k="auto"``:
the width with the most expected committed tokens per second, from the acceptance by position
and the measured cost of each width). The rule, its terms and why each is there:
docs/design/width.md. Every width is verified by the target, so no policy changes greedy
output.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Protocol

from speculant.session.session import ComponentSession, Invocation, Observer
from speculant.workflow.state import DecodeState, RoundResult

AUTO = "auto"
SMOOTHING = 0.3  # weight of one new observation in a time's moving average
ACCEPTANCE_SMOOTHING = 0.15  # ... and in an acceptance's (a short run of rejections passes)
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
    beyond a greedy step under :data:`PROBE_SHARE` of them."""
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
        """Seconds at each of ``widths``: measured, else read off the line through the measured
        widths (docs/design/width.md)."""
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
    """One request's acceptance by position and its choice of k (docs/design/width.md)."""

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




class WidthPolicy(Protocol):
    """Chooses each round's width; told what each proposal cost and what each round did.

    ``widths`` are the widths it may choose (warmed up, captured, before the first round).
    The decode calls :meth:`width` before each proposal, :meth:`proposed` after it and
    :meth:`observe` once the round is read, whatever the policy (a fixed width ignores them).
    """

    widths: range

    def width(self, state: DecodeState, cap: int) -> int:
        """This round's width, at most ``cap`` (0: a greedy step)."""
        ...

    def proposed(self, k: int, seconds: float) -> None:
        """The proposal just made drafted ``k`` tokens in ``seconds`` of host time."""
        ...

    def observe(self, result: RoundResult) -> None:
        """A round was read: its width and how many tokens it committed."""
        ...

    def measuring(self) -> contextmanager:
        """A context the decode runs in (a measured policy observes the sessions there)."""
        ...


class FixedWidth:
    """``k`` drafts every round, fewer only where the round's cap is lower: the null policy."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.widths = range(k, k + 1)

    def width(self, state: DecodeState, cap: int) -> int:
        return min(self.k, cap)

    def proposed(self, k: int, seconds: float) -> None:
        pass

    def observe(self, result: RoundResult) -> None:
        pass

    @contextmanager
    def measuring(self) -> Iterator[None]:
        yield


class MeasuredWidth:
    """``k="auto"``: each round at the width :class:`WidthController` picks from the engine's
    measured :class:`WidthCosts` (shared by its requests) and this request's acceptance.

    Only while :meth:`measuring` are the sessions observed: the target's passes time
    ``t_verify(n)``, the proposer's runs price each proposal by its work, not its launch.
    After a greedy choice the steps before the next probe are taken without asking the rule
    again, :data:`STRETCH` at most (acceptance moves only in a round with drafts).
    """

    def __init__(self, max_k: int, kind: str, costs: WidthCosts, target: ComponentSession,
                 proposing: Sequence[ComponentSession] = ()) -> None:
        self.controller = WidthController(max_k)
        self.kind, self.costs = kind, costs
        self.widths = range(0, max_k + 1)
        self._target, self._proposing = target, tuple(proposing)
        self.chosen: list[int] = []  # the width chosen, per round
        self._num_greedy_left = 0  # greedy steps of the stretch taken, not run yet
        self._widths_proposed: set[int] = set()  # a width's first proposal: not timed
        # when the last proposal returned: (then, its drafts, the verify seconds and the
        # proposals' work seconds past their host's observed by then)
        self._last: tuple[float, int, float, float] | None = None

    @contextmanager
    def measuring(self) -> Iterator[None]:
        costs = self.costs
        with ExitStack() as attached:
            attached.enter_context(_observing(self._target,
                                              costs.verify_observer(self._target.ports.roles)))
            for session in self._proposing:
                attached.enter_context(_observing(session, costs.proposer_observer()))
            yield

    def width(self, state: DecodeState, cap: int) -> int:
        self._observe_last()
        self.costs.proposer_runs.clear()  # runs before this proposal are not its own
        if self._num_greedy_left:
            self._num_greedy_left -= 1
            width = 0
        else:
            width = min(cap, self.controller.choose(self.costs, self.kind))
            if width == 0:
                self._num_greedy_left = self.controller.take_greedy_stretch(STRETCH)
        self.chosen.append(width)
        return width

    def proposed(self, k: int, seconds: float) -> None:
        costs = self.costs
        # a width's first proposal in a request may make that width's plan or session
        # (not a measurement); a greedy step's empty one is not a proposal (t_propose(0) = 0)
        costs.add_proposal(self.kind, k, seconds, timed=k > 0 and k in self._widths_proposed)
        self._widths_proposed.add(k)
        self._last = (time.perf_counter(), k, costs.verify_total, costs.settle_proposals())

    def observe(self, result: RoundResult) -> None:
        if result.k:
            self.controller.observe(result.k, result.num_accepted)

    def timed_warm_up(self, k: int, seconds: float) -> None:
        """A warm-up proposal of ``k`` drafts (plans made already): a measurement."""
        self._widths_proposed.add(k)
        self.proposed(k, seconds)
        self._last = None  # no round yet

    def _observe_last(self) -> None:
        """The last round's time outside its proposal and its target pass."""
        if self._last is not None:
            returned, width, verified, beyond = self._last
            costs = self.costs
            costs.observe_round(time.perf_counter() - returned
                                - (costs.verify_total - verified)
                                - (costs.settle_proposals() - beyond), width)
            self._last = None


@contextmanager
def _observing(session: ComponentSession, observer: Observer) -> Iterator[None]:
    """``observer`` on ``session`` (and on the sessions that share its list) inside."""
    session.observers.append(observer)
    try:
        yield
    finally:
        session.observers.remove(observer)
