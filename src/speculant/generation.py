"""One admitted request being decoded by a scheduler (`BatchedDecode`, with others; `Decode`,
alone: the one-row scheduler), its text (`Stream`), its result (`Generation`), and the
arrival-order turns that keep requests decoded alone by one engine from interleaving
(`Turns`; the engine's scheduler's requests take none).

An open decode holds its engine's turn until it is exhausted, closed (``close()``, the end of
a ``with`` block) or garbage-collected. A decode left suspended by the thread that last
advanced it (a ``break`` out of the loop, the stream kept) is closed by that thread's next
request to the same engine, since that thread can no longer be consuming it: waiting for it
would wait forever."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

from speculant.errors import RequestError
from speculant.speculative.decode import alone
from speculant.speculative.proposal import Proposer
from speculant.speculative.round import Route
from speculant.speculative.scheduler import Entry, Scheduler
from speculant.speculative.width import WidthPolicy
from speculant.workflow.logprobs import TokenLogprob
from speculant.workflow.state import DecodeState
from speculant.workflow.stats import DecodeStats
from speculant.workflow.target_pass import TargetPass

LENGTH_REASONS = ("max_new_tokens", "context_full")  # finish_reason "length"; others: "stop"


@dataclass
class Generation:
    """What one request produced."""

    token_ids: list[int]  # the generated tokens (prompt excluded)
    text: str | None  # their text (stop text excluded), when the package has a tokenizer
    finish_reason: str  # "stop" (EOS, a stop token or string, end of turn) | "length"
    num_prompt_tokens: int
    stats: DecodeStats  # this request's; stats.stop_reason says which rule fired
    time_to_first_token_s: float  # admission + prefill
    total_s: float  # admission to the last token
    logprobs: list[TokenLogprob] | None = None  # one per generated token, when asked
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per prompt token (first None)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over ``total_s`` (admission and prefill included)."""
        return len(self.token_ids) / self.total_s if self.total_s > 0 else float("inf")


def generation_of(state: DecodeState, tokenizer, started: float, first_at: float | None,
                  ended_at: float) -> Generation:
    """What a finished decode produced (``first_at`` None: no token)."""
    ids = state.tokens[state.prompt_len:]
    if state.text is not None:
        state.text.finish()  # the held-back tail, unless a stop string ended it
        text: str | None = state.text.text
    else:
        text = tokenizer.decode(ids) if tokenizer.has_text else None
    reason = "length" if state.stop_reason in LENGTH_REASONS else "stop"
    first = first_at if first_at is not None else ended_at
    recorded = state.logprobs
    return Generation(list(ids), text, reason, state.prompt_len, state.stats,
                      first - started, ended_at - started,
                      None if recorded is None else list(recorded.generated),
                      None if recorded is None else recorded.prompt)


class Turn:
    """A granted ticket: the engine is this request's until :meth:`release`. ``holder`` is
    the thread that last opened or advanced the decode; ``decode`` (weak) is the decode."""

    def __init__(self, turns: Turns, ticket: int) -> None:
        self.turns, self.ticket, self.is_released = turns, ticket, False
        self.holder = threading.get_ident()
        self.decode: weakref.ref[Decode] | None = None

    def release(self) -> None:
        if not self.is_released:
            self.is_released = True
            self.turns.release(self)


class Turns:
    """A first-come, first-served lock: each caller gets a ticket and waits for its number.

    Not re-entrant, and not tied to a thread: a stream may be opened in one thread and
    consumed (or closed) in another, and a thread that asks while another thread's stream is
    open waits until that stream is exhausted or closed. A thread that asks while the turn is
    held by a decode it left suspended itself closes that decode first (:meth:`Decode.supersede`):
    it cannot be consuming it while it asks, so the wait could never end."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._next_ticket = 0
        self._serving = 0
        self._abandoned: set[int] = set()
        self._held: Turn | None = None  # the granted turn, until released

    def wait(self) -> Turn:
        self._close_own_suspended()
        with self._condition:
            ticket = self._next_ticket
            self._next_ticket += 1
            try:
                while self._serving != ticket:
                    self._condition.wait()
            except BaseException:  # interrupted while waiting: give the ticket up
                self._abandoned.add(ticket)
                raise
            self._held = Turn(self, ticket)
            return self._held

    def release(self, turn: Turn) -> None:
        with self._condition:
            if self._held is turn:
                self._held = None
            self._serving = turn.ticket + 1
            while self._serving in self._abandoned:
                self._abandoned.discard(self._serving)
                self._serving += 1
            self._condition.notify_all()

    def _close_own_suspended(self) -> None:
        held = self._held
        if held is None or held.holder != threading.get_ident():
            return
        decode = held.decode() if held.decode is not None else None
        if decode is not None:
            decode.supersede()
        held.release()


class BatchedDecode:
    """A request decoded with others by the engine's scheduler (speculative/scheduler.py):
    iterate for its committed token ids — each ``next`` steps the scheduler, every row with
    it, until this request has a token (so any thread may drive it; one step runs at a
    time) — ``result`` once exhausted; ``close()`` cancels it, its row free at the next
    step. :class:`Stream` gives its text pieces, as a :class:`Decode`'s."""

    def __init__(self, entry: Entry, scheduler: Scheduler, tokenizer) -> None:
        self.entry, self.scheduler, self.tokenizer = entry, scheduler, tokenizer
        self.state = entry.state

    def __iter__(self) -> BatchedDecode:
        return self

    def __enter__(self) -> BatchedDecode:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __next__(self) -> int:
        entry = self.entry
        while not entry.committed:
            if entry.error is not None:
                raise entry.error
            if entry.is_done:
                raise StopIteration
            self.scheduler.step()
        return entry.committed.popleft()

    @property
    def stats(self) -> DecodeStats:
        return self.state.stats

    @property
    def is_finished(self) -> bool:
        return self.entry.is_done

    def close(self) -> None:
        """Cancel the request (a client that went away): nothing more is committed."""
        self.entry.cancel()
        self.entry.committed.clear()

    def __del__(self) -> None:  # an abandoned request must not hold its row to the end
        if not self.entry.is_done:
            self.entry.cancel()

    @property
    def result(self) -> Generation:
        entry = self.entry
        if not entry.is_done and entry.state.is_stopped:
            self.scheduler.step()  # a cancelled request leaves at the next step
        if entry.ended_at is None:
            raise RequestError("the request has not finished", path="result",
                               remedy="iterate it to the end, or close() it first")
        if entry.error is not None:
            raise entry.error
        return generation_of(self.state, self.tokenizer, entry.submitted_at, entry.first_at,
                             entry.ended_at)


class Decode(BatchedDecode):
    """An admitted request decoded alone: a scheduler of one row over the engine's target
    pass (speculative/decode.py's ``alone``), stepped by each ``next``. Holds the engine's
    turn until exhausted, closed, left by a ``with`` block, collected, or superseded by its
    thread's next request (the module's docstring)."""

    def __init__(self, state: DecodeState, target: TargetPass, proposer: Proposer | None,
                 policy: WidthPolicy, route: Route, turn: Turn, tokenizer) -> None:
        scheduler, entry = alone(state, target, proposer, policy, route)
        super().__init__(entry, scheduler, tokenizer)
        self._turn = turn
        turn.decode = weakref.ref(self)
        self._is_superseded = False

    def __next__(self) -> int:
        if self._is_superseded:
            raise RequestError("this stream was closed when the thread that left it suspended "
                               "sent the engine its next request", path="stream",
                               remedy="finish or close() a stream before the next request on "
                                      "its thread (with engine.stream(...) as pieces: ...)")
        self._turn.holder = threading.get_ident()
        try:
            return super().__next__()
        except BaseException:  # the end, a stop, or an error: the engine is free again
            self.close()
            raise

    def close(self) -> None:
        """Stop decoding now (a client that went away); the engine is free again."""
        if not self.entry.is_done:
            super().close()
            self.scheduler.step()  # it leaves: nothing runs
        self._turn.release()

    def supersede(self) -> None:
        """Close this decode for a later request of the thread that left it suspended; its
        iteration then raises :class:`RequestError` (``result`` stays readable)."""
        if not self.entry.is_done:
            self._is_superseded = True
            self.close()

    def __del__(self) -> None:  # an abandoned decode must not hold the engine forever
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
        finally:
            self._turn.release()


class Stream:
    """Text pieces of a :class:`Decode` (never a broken character, never stop text). A
    context manager: leaving ``with engine.stream(...) as pieces:`` closes it."""

    def __init__(self, decode: Decode | BatchedDecode) -> None:
        assert decode.state.text is not None
        self.decode = decode
        self._text = decode.state.text
        self._is_done = False

    def __iter__(self) -> Stream:
        return self

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __next__(self) -> str:
        while not self._is_done:
            try:
                next(self.decode)
            except StopIteration:
                self._is_done = True
                tail = self._text.finish()
                if tail:
                    return tail
                break
            piece = self._text.take()
            if piece:
                return piece
        raise StopIteration

    def close(self) -> None:
        if not self._is_done:
            self._is_done = True
            self.decode.close()
            self._text.finish()

    @property
    def stats(self) -> DecodeStats:
        return self.decode.stats

    @property
    def result(self) -> Generation:
        """The :class:`Generation`, once the stream is exhausted or closed."""
        return self.decode.result
