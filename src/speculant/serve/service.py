"""One engine behind the routes: requests are admitted (a bounded queue, a deadline each),
decoded step by step, and counted.

Every request, streamed or not, is decoded as an iterator (``engine.stream``,
``engine.decode``; with ``--max-batch`` above 1, a row of the engine's scheduler:
``engine.submit_stream``, ``engine.submit``) whose steps run on the worker thread of the
service's :class:`~speculant.aio.AsyncEngine` (awaiting a step can be given up at a deadline
or a disconnect: the step runs on, its result unread); between two steps
the request's deadline and its client are checked, so a request past its deadline, or whose
client went away, stops there and frees the engine. Requests wait for the engine in the
:class:`Admission` queue (asyncio, holding no thread).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from speculant import GenerationOptions
from speculant.aio import AsyncEngine
from speculant.errors import RequestError
from speculant.serve.admission import Admission, DeadlineExceededError, Ticket
from speculant.serve.limits import UNDECLARED_CONTEXT_TOKENS, ServerLimits
from speculant.serve.metrics import ServerMetrics
from speculant.speculative.kinds import widest_k

STEP_SLICE_S = 0.05  # a non-streamed request's engine call decodes this long between checks


@dataclass
class Piece:
    """A text piece of a stream; the last one carries the result. ``logprobs``: the entries
    of the tokens committed since the previous piece, where the request records them."""

    text: str
    result: Any = None
    logprobs: list = field(default_factory=list)


class ClientGoneError(Exception):
    """The client of a non-streamed request disconnected; its decode was stopped."""


class Service:
    def __init__(self, engine: Any, model_name: str, defaults: GenerationOptions,
                 limits: ServerLimits) -> None:
        self.engine = engine
        self.model_name = model_name
        self.defaults = defaults
        self.limits = limits
        if not isinstance(limits.max_batch, int) or limits.max_batch < 1:
            raise RequestError("max_batch must be a number of requests >= 1",
                               path="max_batch", value=limits.max_batch,
                               expected="an integer >= 1")
        self.metrics = ServerMetrics(model_name, limits.max_batch)
        self.is_batched = limits.max_batch > 1
        if self.is_batched:  # a package that cannot batch, or too many rows: refused now
            self.metrics.watch(engine.scheduler)
        self.admission = Admission(max_running=limits.max_batch,
                                   max_waiting=limits.max_waiting,
                                   timeout_s=limits.request_timeout_s,
                                   retry_after_s=limits.retry_after_s)
        self.aengine = AsyncEngine(engine)  # every engine call runs on its worker
        self.metrics.waiting.labels(model_name).set_function(lambda: self.admission.num_waiting)
        self.metrics.running.labels(model_name).set_function(
            lambda: len(self.admission.running))

    def open(self, prompt: Any, options: GenerationOptions, *, text: bool) -> Any:
        """A request's decode, iterated on the engine thread: alone (``engine.stream`` for
        text pieces, ``engine.decode`` for token ids), or with ``--max-batch`` above 1 a row
        of the engine's scheduler, whose every step — run by whichever request asks for its
        next piece — advances every row."""
        if self.is_batched:
            submit = self.engine.submit_stream if text else self.engine.submit
        else:
            submit = self.engine.stream if text else self.engine.decode
        return submit(prompt, options)

    def budgeted(self, options: GenerationOptions, asked: int | None,
                 count_prompt: Callable[[], int]) -> GenerationOptions:
        """``options`` with ``max_new_tokens``: ``asked`` (None: the cap), at most the cap,
        ``--max-tokens`` or else the remaining context. Appended caches stop at the package's
        context length by themselves (finish_reason "length"); static caches need the prompt
        counted (``count_prompt``), as they must hold prompt + max_new_tokens + k + 1."""
        plan = self.engine.package.plan
        caps = [c for c in (asked, self.limits.max_tokens, plan.context_cap) if c is not None]
        if plan.static is not None and plan.static.capacity is not None:
            widest = widest_k(self.engine.proposer_sources, options.proposer, options.k)
            caps.append(plan.static.capacity - count_prompt() - widest - 1)
        if plan.context_cap is None and self.limits.max_tokens is None:
            caps.append(UNDECLARED_CONTEXT_TOKENS)
        return dataclasses.replace(options, max_new_tokens=max(min(caps), 1))

    async def complete(self, open_decode: Callable[[], Any],
                       is_disconnected: Callable[[], Awaitable[bool]]) -> Any:
        """Decode a non-streamed request (``open_decode``: ``engine.decode`` / ``chat_stream``)
        to its result; a client gone between two steps stops it (:class:`ClientGoneError`)."""
        steps = self.stream(open_decode, slice_s=STEP_SLICE_S)
        try:
            async for piece in steps:
                if piece is not None and piece.result is not None:
                    return piece.result
                if await is_disconnected():
                    raise ClientGoneError("the client went away")
        finally:
            await steps.aclose()
        raise AssertionError("a decode ended without its result")

    async def stream(self, open_decode: Callable[[], Any], *, slice_s: float = 0.0
                     ) -> AsyncIterator[Piece | None]:
        """Yield None once admitted (a bad request, a full queue or a deadline passed while
        waiting raise before that), then pieces: one per engine call, which decodes for
        ``slice_s`` (0: one piece); the last carries the result.

        Prime it with ``await gen.__anext__()`` before answering 200: then an admission error
        becomes a 4xx/5xx. Closing the generator early (the client went away) or a deadline
        passing stops the decode between steps; the engine is given back once its current
        step has returned and the decode is closed.
        """
        loop = asyncio.get_running_loop()
        ticket = self.admission.arrive()
        first_at, reason = None, "abort"  # reason: how it ended, unless finished
        opened: dict[str, Any] = {}
        async with self.admission.slot(ticket) as release:
            self.metrics.queue_time.labels(self.model_name).observe(
                ticket.started_at - ticket.arrived_at)  # type: ignore[operator]
            try:
                await self._step(ticket, lambda: opened.setdefault("decode", open_decode()),
                                 "admitting it")
                yield None
                pieces, is_done, num_sent = iter(opened["decode"]), False, 0
                while not is_done:
                    taken, is_done = await self._step(
                        ticket, lambda: _advance(pieces, slice_s), "decoding")
                    first_at = first_at or (loop.time() if taken else None)
                    if taken:
                        recorded = _recorded(opened["decode"])
                        yield Piece("".join(t for t in taken if isinstance(t, str)),
                                    logprobs=recorded[num_sent:])
                        num_sent = len(recorded)
                result, reason = opened["decode"].result, "finished"
                self.metrics.observe_finished(result, (first_at or loop.time())
                                              - ticket.arrived_at, loop.time() - ticket.arrived_at)
                yield Piece("", result, _recorded(opened["decode"])[num_sent:])
            except DeadlineExceededError:
                reason = "timeout"
                raise
            finally:
                decode = opened.get("decode")
                self.aengine.call_then(lambda: decode and decode.close(), release)
                if reason != "finished" and (decode is not None or reason == "timeout"):
                    self.metrics.observe_aborted(reason, loop.time() - ticket.arrived_at)

    async def _step(self, ticket: Ticket, call: Callable[[], Any], doing: str) -> Any:
        """``call()`` on the engine thread, awaited until the ticket's deadline."""
        try:
            async with asyncio.timeout_at(ticket.deadline):
                outcome = await self.aengine.call(call)
        except TimeoutError:
            raise self.admission.late(ticket, doing) from None
        ticket.last_step_at = asyncio.get_running_loop().time()
        return outcome


def _recorded(decode: Any) -> list:
    """The log-probability entries a decode (or the stream over it) has recorded so far."""
    state = getattr(getattr(decode, "decode", decode), "state", None)
    recorded = getattr(state, "logprobs", None)
    return recorded.generated if recorded is not None else []


def _advance(pieces: Iterator, slice_s: float) -> tuple[list, bool]:
    """The next pieces of ``pieces``: at least one, more until ``slice_s`` has passed;
    whether the iterator is exhausted."""
    taken: list = []
    until = time.perf_counter() + slice_s
    for piece in pieces:
        taken.append(piece)
        if time.perf_counter() >= until:
            return taken, False
    return taken, True
