"""One admitted request being decoded (`Decode`, `Stream`), its result (`Generation`), and the
arrival-order turns that keep requests to one engine from interleaving (`Turns`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from speculant.errors import RequestError
from speculant.speculative.decode import decode
from speculant.speculative.proposal import Proposer
from speculant.speculative.round import Route
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


class Turn:
    def __init__(self, turns: Turns, ticket: int) -> None:
        self.turns, self.ticket, self.is_released = turns, ticket, False

    def release(self) -> None:
        if not self.is_released:
            self.is_released = True
            self.turns.release(self)


class Turns:
    """A first-come, first-served lock: each caller gets a ticket and waits for its number.

    Not re-entrant, and not tied to a thread: a stream may be opened in one thread and
    consumed (or closed) in another. A thread that holds an open stream and asks the same
    engine for another request waits until that stream is exhausted or closed."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._next_ticket = 0
        self._serving = 0
        self._abandoned: set[int] = set()

    def wait(self) -> Turn:
        with self._condition:
            ticket = self._next_ticket
            self._next_ticket += 1
            try:
                while self._serving != ticket:
                    self._condition.wait()
            except BaseException:  # interrupted while waiting: give the ticket up
                self._abandoned.add(ticket)
                raise
            return Turn(self, ticket)

    def release(self, turn: Turn) -> None:
        with self._condition:
            self._serving = turn.ticket + 1
            while self._serving in self._abandoned:
                self._abandoned.discard(self._serving)
                self._serving += 1
            self._condition.notify_all()


class Decode:
    """An admitted request: iterate for its committed token ids; ``result`` at the end.
    Holds the engine's turn until exhausted or closed."""

    def __init__(self, state: DecodeState, target: TargetPass, proposer: Proposer | None,
                 policy: WidthPolicy, route: Route, turn: Turn, tokenizer) -> None:
        self.state = state
        self.tokenizer = tokenizer
        self._tokens: Iterator[int] = decode(state, target, proposer, policy, route)
        self._turn = turn
        self._started = time.perf_counter()
        self._first_at: float | None = None
        self._ended_at: float | None = None

    def __iter__(self) -> Decode:
        return self

    def __next__(self) -> int:
        if self._ended_at is not None:
            raise StopIteration
        try:
            token = next(self._tokens)
        except BaseException:  # the end, a stop, or an error: the engine is free again
            self._end()
            raise
        if self._first_at is None:
            self._first_at = time.perf_counter()
        return token

    @property
    def stats(self) -> DecodeStats:
        return self.state.stats

    @property
    def is_finished(self) -> bool:
        return self._ended_at is not None

    def close(self) -> None:
        """Stop decoding now (a client that went away); the engine is free again."""
        if self._ended_at is None:
            self.state.stop("closed")
            self._tokens.close()
            self._end()

    @property
    def result(self) -> Generation:
        if self._ended_at is None:
            raise RequestError("the decode has not finished", path="result",
                               remedy="iterate it to the end, or close() it first")
        state = self.state
        ids = state.tokens[state.prompt_len:]
        if state.text is not None:
            state.text.finish()  # the held-back tail, unless a stop string ended it
            text: str | None = state.text.text
        else:
            text = self.tokenizer.decode(ids) if self.tokenizer.has_text else None
        reason = "length" if state.stop_reason in LENGTH_REASONS else "stop"
        first = self._first_at if self._first_at is not None else self._ended_at
        recorded = state.logprobs
        return Generation(list(ids), text, reason, state.prompt_len, state.stats,
                          first - self._started, self._ended_at - self._started,
                          None if recorded is None else list(recorded.generated),
                          None if recorded is None else recorded.prompt)

    def _end(self) -> None:
        if self._ended_at is None:
            self._ended_at = time.perf_counter()
            self.state.stats.stop_reason = self.state.stop_reason
            self.state.stats.residency = self.state.seam.counters.snapshot()
            self._turn.release()

    def __del__(self) -> None:  # an abandoned decode must not hold the engine forever
        try:
            self._turn.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Stream:
    """Text pieces of a :class:`Decode` (never a broken character, never stop text)."""

    def __init__(self, decode: Decode) -> None:
        assert decode.state.text is not None
        self.decode = decode
        self._text = decode.state.text
        self._is_done = False

    def __iter__(self) -> Stream:
        return self

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
