"""The scheduler, the engine's one loop: requests decoded together run one batched target
pass per step (continuous batching; docs/design/batching.md); a request decoded alone is the
same loop at one row over its own target pass (:class:`LoneTarget`: speculative/decode.py).

Requests join and leave between steps. Each keeps its :class:`DecodeState` (stream, stop
rules, sampler, counters), proposer and width policy, and holds a row while it decodes, its
consumed count the row's cursor. Invariant between steps: every decoding row satisfies the
decode state's invariant; a prefilling row holds its first ``C < P`` prompt positions. A
row's rounds are its :class:`Rounds`: in a batched step the reference round, its pass the
row's part of the one batched pass, its drafts made first with the other rows' where its
proposer drafts rows together (:class:`RowsProposer`), its ``k="auto"`` as wide as the
step's :class:`StepWidth` chooses by load.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

from speculant.errors import AdmissionError, SpeculantError
from speculant.speculative.proposal import (
    HOST_ROUNDS,
    Proposal,
    Proposer,
    RowsFallback,
    RowsProposer,
)
from speculant.speculative.round import Rounds, Route, warm_up
from speculant.speculative.step_width import StepWidth
from speculant.speculative.width import WidthPolicy
from speculant.tensors import Value
from speculant.workflow.batched_pass import BatchedTargetPass, RowBlock, row_bucket
from speculant.workflow.cells import RowCells
from speculant.workflow.request import Admitted
from speculant.workflow.sampler import choose
from speculant.workflow.state import DecodeState
from speculant.workflow.target_pass import PassResult, PendingPass, TargetPass, resolved

PREFILL_CHUNK = 128  # prompt tokens a row consumes per step, at most
# a batched row's rounds: each read before the next, its pass the row's of the step's
BATCHED = Route(HOST_ROUNDS, False, 0, "batched: one row of the scheduler's passes, each "
                                       "round read before the next")


@dataclass(frozen=True)
class LoneTarget:
    """The scheduler's target for a request decoded alone: one row, its own target pass,
    which runs each pass as it is launched (no batch to wait for) and plans every width
    before the first round (round.py's ``warm_up``), its rounds launched by ``route``."""

    target: TargetPass
    route: Route
    rows = 1


@dataclass(eq=False)
class Entry:
    """One request in the scheduler: its decode, its row, and the tokens committed that its
    handle has not taken yet."""

    state: DecodeState
    proposer: Proposer | None
    policy: WidthPolicy
    committed: deque[int] = field(default_factory=deque)  # committed, not taken yet
    rounds: Rounds | None = None  # its rounds, once its prompt is consumed
    measuring: ExitStack = field(default_factory=ExitStack)  # its policy's, while it decodes
    error: SpeculantError | None = None  # what ended it, if not a stop rule
    is_done: bool = False  # it left: nothing more will be committed
    submitted_at: float = field(default_factory=time.perf_counter)
    first_at: float | None = None  # when its first token was committed
    ended_at: float | None = None

    @property
    def cells(self) -> RowCells:
        return self.state.cells  # type: ignore[return-value]

    @property
    def is_prefilling(self) -> bool:
        return self.state.consumed < self.state.prompt_len

    @property
    def widest(self) -> int:
        return self.policy.widths[-1] if self.proposer is not None else 0

    def cancel(self) -> None:
        """Stop it (a client that went away): it leaves at the next step, its row free."""
        self.state.stop("closed")


class StepBatch:
    """The rows' blocks of one step, run as one batched pass. To a row's round it is the
    target (``launch_host_round``'s): a pass joins the batch at the row's start — the
    state's consumed count — and is resolved once the batch has run."""

    def __init__(self) -> None:
        self.blocks: list[RowBlock] = []
        self.results: list[PassResult] | None = None
        self.seconds: float | None = None  # the pass's; None: its plan was made in it
        self.num_run = 0  # the rows of the buffers the pass ran (row_bucket)

    @property
    def width(self) -> int:
        return max(len(block.tokens) for block in self.blocks)

    def run(self, tokens: list[int], start: int, cells: RowCells, admitted: Admitted,
            controls: dict[str, Value], *, drafts: Value | None = None) -> QueuedPass:
        assert drafts is None, "a batched row's drafts are on the host"
        self.blocks.append(RowBlock(tuple(tokens), start, cells))
        return QueuedPass(self, len(self.blocks) - 1)

    def run_together(self, target: BatchedTargetPass) -> None:
        self.num_run = row_bucket(max(block.cells.row for block in self.blocks), target.rows)
        is_planned = (self.num_run, self.width) in target.plans
        started = time.perf_counter()
        self.results = target.run(self.blocks)
        self.seconds = time.perf_counter() - started if is_planned else None


@dataclass(frozen=True)
class QueuedPass:
    """A row's pass in a :class:`StepBatch`, resolved once the batch has run."""

    batch: StepBatch
    index: int

    def resolve(self) -> PassResult:
        assert self.batch.results is not None, "read before the step's batched pass ran"
        return self.batch.results[self.index]


@dataclass(frozen=True)
class Drafted:
    """A row's drafts made with the other rows' (:class:`RowsProposer`), proposed by its
    round as host tokens."""

    proposal: Proposal

    def propose(self, state: DecodeState, k: int) -> Proposal:
        return self.proposal


class Scheduler:
    """The engine's loop: :meth:`submit` queues an admitted request, :meth:`step` runs one
    step for every row (the module says what a step does). Over a :class:`LoneTarget`, one
    row whose passes run as they are launched; over a batched target, its rows."""

    def __init__(self, target: BatchedTargetPass | LoneTarget, *,
                 prefill_chunk: int = PREFILL_CHUNK) -> None:
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or \
                prefill_chunk < 1:
            raise AdmissionError("prefill_chunk must be a number of prompt tokens >= 1",
                                 path="prefill_chunk", value=prefill_chunk,
                                 expected="an integer >= 1 (default 128)")
        self.target = target
        self.lone = target if isinstance(target, LoneTarget) else None
        # a lone request's prompt is one pass (no other row waits on its chunks)
        self.prefill_chunk = sys.maxsize if self.lone is not None else prefill_chunk
        self.rows: list[Entry | None] = [None] * target.rows  # row -> its request
        self.waiting: deque[Entry] = deque()  # admitted, waiting for a free row
        self.num_steps = 0
        self.widths = StepWidth()  # k="auto" rows: each step's width, by measured load
        self.step_observers: list[Callable[[int], None]] = []  # each told a pass's rows
        self._lock = threading.Lock()  # one step at a time, whoever drives it

    @property
    def has_work(self) -> bool:
        return bool(self.waiting) or any(entry is not None for entry in self.rows)

    def submit(self, state: DecodeState, proposer: Proposer | None,
               policy: WidthPolicy) -> Entry:
        """Queue an admitted request (its state's cells a reserved :class:`RowCells` of a
        batched target); it takes a row at the next step with one free. Inactive serving
        controls end it now."""
        if self.lone is None:
            policy = self.widths.row_policy(policy)
            state.stats.route = BATCHED.reason
        entry = Entry(state, proposer, policy)
        with self._lock:
            if state.is_active:
                self.waiting.append(entry)
            else:
                state.stop("inactive")
                self._end(entry)
        return entry

    def step(self) -> bool:
        """One step: admit, propose, one batched pass, accept and commit per row, leave.
        False when no request was waiting or decoding (nothing ran)."""
        with self._lock:
            self._leave()
            # 1. Waiting requests take free rows.
            for row, taken in enumerate(self.rows):
                if taken is None and self.waiting:
                    self.rows[row] = entry = self.waiting.popleft()
                    if self.lone is None:
                        entry.cells.row = row
            busy = [entry for entry in self.rows if entry is not None]
            if not busy:
                return False
            # 2. The step's width W keeps every row's window [L_b, L_b + W) in its row.
            room = self._room(busy)
            is_prefilling = any(entry.is_prefilling for entry in busy)
            decoding = [entry for entry in busy if not entry.is_prefilling]
            started = time.perf_counter()
            if decoding and self.lone is None:  # k="auto" rows: the step's W
                self.widths.choose([(entry.policy, min(entry.state.capped_width(
                    entry.widest), room - 1), entry.proposer) for entry in decoding],
                    row_bucket(max(entry.cells.row for entry in decoding), self.target.rows))
            batch, launched, widths, drafted = StepBatch(), {}, {}, {}
            for entry in busy:
                try:
                    widths[entry] = self._width(entry, room)
                except SpeculantError as error:  # its policy's: the request ends alone
                    self._fail(entry, error)
            if self.lone is None:  # rows drafted together first
                drafting = time.perf_counter()
                drafted = self._draft_rows(widths)
                self.widths.drafted_together([(entry.policy, widths[entry])
                                              for entry in drafted],
                                             time.perf_counter() - drafting)
            target = self.lone.target if self.lone is not None else batch
            for entry in [entry for entry in busy if entry in widths]:
                try:
                    launched[entry] = self._launch(entry, target, room, widths[entry],
                                                   drafted.get(entry))
                except SpeculantError as error:  # its proposer's: the request ends alone
                    self._fail(entry, error)
            busy = list(launched)
            # 3. One target pass for every row (a lone row's ran as it was launched).
            try:
                if batch.blocks:
                    batch.run_together(self.target)
            except SpeculantError as error:
                for entry in busy:
                    self._fail(entry, error)
            else:
                for entry in busy:  # 4. Accept and commit per row.
                    try:
                        self._read(entry, launched[entry])
                    except SpeculantError as error:
                        self._fail(entry, error)
                if batch.blocks:
                    self.widths.observe_step(len(busy), batch.num_run, batch.width,
                                             batch.seconds, time.perf_counter() - started,
                                             not is_prefilling)
            self.num_steps += 1
            for observe in self.step_observers if busy else ():
                observe(len(busy))
            self._leave()  # 5. Stopped and cancelled rows leave.
            return True

    def _room(self, busy: list[Entry]) -> int:
        """The positions every busy row has left in its row of the buffers, grown first to
        the widest reservation (a lone row: its own caches bound it, ``capped_width``)."""
        if self.lone is not None:
            return sys.maxsize
        self.target.fit(max(entry.cells.capacity for entry in busy))
        return min(self.target.capacity - entry.state.consumed for entry in busy)

    def _width(self, entry: Entry, room: int) -> int | None:
        """A decoding row's k this step, whether or not another row prefills in it (drafts
        cost what they cost in any step); 0 for a prefilling row; None for a lone row,
        whose rounds choose theirs as deep as they are queued."""
        if entry.is_prefilling or self.lone is not None:
            return 0 if entry.is_prefilling else None
        return entry.policy.width(
            entry.state, min(entry.state.capped_width(entry.widest), room - 1))

    def _draft_rows(self, widths: dict[Entry, int]) -> dict[Entry, Drafted]:
        """The drafts of every row whose proposer drafts rows together, one
        ``propose_rows`` per proposer (a :class:`RowsFallback` row joins its ``rows``
        where it does not draft alone): a row's error ends it alone, a failed run every row
        of that proposer."""
        groups: dict[int, tuple[RowsProposer, list[Entry]]] = {}
        drafted = {}
        for entry, k in widths.items():
            proposer = entry.proposer
            if k and isinstance(proposer, RowsFallback):  # its own drafts, else its rows'
                found = proposer.propose_ahead(entry.state, k)
                if found is not None:
                    drafted[entry] = Drafted(found)
                    continue
                proposer = proposer.rows
            if k and isinstance(proposer, RowsProposer):
                groups.setdefault(id(proposer), (proposer, []))[1].append(entry)
        for proposer, entries in groups.values():
            try:
                proposals = proposer.propose_rows([(e.state, widths[e]) for e in entries])
            except SpeculantError as error:
                proposals = [error] * len(entries)
            for entry, proposal in zip(entries, proposals, strict=True):
                if isinstance(proposal, SpeculantError):
                    self._fail(entry, proposal)
                    del widths[entry]
                else:
                    drafted[entry] = Drafted(proposal)
        return drafted

    def _launch(self, entry: Entry, target: StepBatch | TargetPass, room: int,
                k: int | None, drafted: Drafted | None) -> PassResult | PendingPass | None:
        """A prefilling row's next prompt chunk (its pass returned), or a decoding row's
        rounds filled: ``k`` drafts (``drafted``: made with the other rows' already), or
        as its own rounds choose (None)."""
        state = entry.state
        if entry.is_prefilling:
            start = state.consumed
            chunk = state.tokens[start:min(start + min(self.prefill_chunk, room),
                                           state.prompt_len)]
            return target.run(chunk, start, entry.cells, state.admitted, state.controls)
        assert entry.rounds is not None
        entry.rounds.fill(target, k, drafted)
        return None

    def _read(self, entry: Entry, launched: PassResult | PendingPass | None) -> None:
        state = entry.state
        if launched is not None:
            chunk = resolved(launched)
            if chunk.end < state.prompt_len:  # the prompt goes on next step
                state.record_chunk(chunk)
                return
            # the prompt's last row gives the first token, at position P
            last_row = state.seam.last_along_axis(chunk.logits, chunk.logits.rank - 2)
            first, _ = choose(state.seam, state.sampler, last_row, len(state.tokens),
                              state.constraint)
            committed = state.record_prefill(chunk, first)
            if not state.is_stopped:
                self._start_rounds(entry)
        else:
            result = entry.rounds.read()
            entry.policy.observe(result)
            committed = state.record(result)
        if committed and entry.first_at is None:
            entry.first_at = time.perf_counter()
        entry.committed.extend(committed)

    def _start_rounds(self, entry: Entry) -> None:
        """A row whose prompt is consumed decodes in rounds, its policy measuring; a lone
        row's widths are planned first."""
        state, lone = entry.state, self.lone
        entry.measuring.enter_context(entry.policy.measuring())
        if lone is not None:
            warm_up(state, lone.target, entry.proposer, entry.policy)
        entry.rounds = Rounds(state, entry.proposer, entry.policy,
                              lone.route if lone is not None else BATCHED,
                              lone.target.session.device if lone is not None else None)

    def _fail(self, entry: Entry, error: SpeculantError) -> None:
        entry.error = error
        entry.state.stop("error")

    def _leave(self) -> None:
        """Free the row of every stopped request and end it; a cancelled waiting request
        leaves the queue."""
        for row, entry in enumerate(self.rows):
            if entry is not None and entry.state.is_stopped:
                self.rows[row] = None
                if self.lone is None:
                    entry.cells.row = None
                self._end(entry)
        for entry in [e for e in self.waiting if e.state.is_stopped]:
            self.waiting.remove(entry)
            self._end(entry)

    def _end(self, entry: Entry) -> None:
        entry.is_done, entry.ended_at = True, time.perf_counter()
        entry.measuring.close()
        stats = entry.state.stats
        stats.stop_reason = entry.state.stop_reason
        stats.residency = entry.state.seam.counters.snapshot()
