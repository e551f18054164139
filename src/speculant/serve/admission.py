"""Who may use the engine, for how long: a bounded queue and a deadline per request (the
engine's steps run on its :class:`~speculant.aio.AsyncEngine`'s worker thread).

:class:`Admission` lets ``max_running`` requests run and ``max_waiting`` wait, in arrival
order; one more is a :class:`QueueFullError` (429). Every request gets a :class:`Ticket` with
a deadline from its arrival, waiting included (:class:`DeadlineExceededError`, 504). A
running request gives its slot back only once the engine has finished with it (its last
step returned and its decode is closed), so a step that never returns keeps the engine
counted as busy, and :meth:`Admission.stalled` names it for ``/health``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from speculant.errors import SpeculantError


class QueueFullError(SpeculantError):
    """The engine's queue is full; the client may retry after ``retry_after_s`` (429)."""

    status, code = 429, "queue_full"

    def __init__(self, message: str, *, retry_after_s: int, **details: Any) -> None:
        super().__init__(message, **details)
        self.retry_after_s = retry_after_s


class DeadlineExceededError(SpeculantError):
    """A request passed its deadline, waiting or decoding (504)."""

    status, code = 504, "deadline_exceeded"


@dataclass(eq=False)  # hashed by identity: one per request
class Ticket:
    """One request's place: times are the event loop's clock (seconds)."""

    arrived_at: float
    deadline: float
    started_at: float | None = None  # when it got a slot
    last_step_at: float | None = None  # when its last engine step returned


class Admission:
    def __init__(self, *, max_running: int, max_waiting: int, timeout_s: float,
                 retry_after_s: int) -> None:
        self.max_running, self.max_waiting = max_running, max_waiting
        self.timeout_s, self.retry_after_s = timeout_s, retry_after_s
        self.num_waiting = 0
        self.running: set[Ticket] = set()
        self._slots = asyncio.Semaphore(max_running)  # first come, first served

    def arrive(self) -> Ticket:
        now = asyncio.get_running_loop().time()
        return Ticket(now, now + self.timeout_s)

    @asynccontextmanager
    async def slot(self, ticket: Ticket) -> AsyncIterator[Callable[[], None]]:
        """Wait for a slot until the ticket's deadline; yields ``release``, which the holder
        calls once the engine is done with the request (maybe after this block)."""
        if len(self.running) >= self.max_running and self.num_waiting >= self.max_waiting:
            raise QueueFullError(f"{self.num_waiting} requests are waiting for the engine, "
                                 f"the most it queues", path="max_waiting",
                                 value=self.num_waiting, retry_after_s=self.retry_after_s,
                                 remedy=f"retry after {self.retry_after_s} s")
        self.num_waiting += 1
        try:
            async with asyncio.timeout_at(ticket.deadline):
                await self._slots.acquire()
        except TimeoutError:
            raise self.late(ticket, "waiting for the engine") from None
        finally:
            self.num_waiting -= 1
        ticket.started_at = asyncio.get_running_loop().time()
        self.running.add(ticket)
        is_released = False

        def release() -> None:
            nonlocal is_released
            if not is_released:
                is_released = True
                self.running.discard(ticket)
                self._slots.release()
        yield release

    def late(self, ticket: Ticket, doing: str) -> DeadlineExceededError:
        return DeadlineExceededError(f"the request passed its deadline of {self.timeout_s:g} s "
                                     f"{doing}", path="request_timeout", value=self.timeout_s,
                                     remedy="ask for fewer tokens, or retry when the server "
                                            "is less busy")

    def stalled(self, grace_s: float) -> str | None:
        """Why the engine looks stuck: a running request ``grace_s`` past its deadline (it
        would have stopped at its next step), or None."""
        now = asyncio.get_running_loop().time()
        for ticket in self.running:
            if now > ticket.deadline + grace_s:
                since = now - (ticket.last_step_at or ticket.started_at or ticket.arrived_at)
                return (f"a request has run {now - ticket.arrived_at:.0f} s, past its deadline "
                        f"({self.timeout_s:g} s) + grace ({grace_s:g} s); its current engine "
                        f"step started {since:.0f} s ago and has not returned")
        return None
