"""One engine behind the routes: requests take it in arrival order, and are counted.

The engine serves one request at a time; a stream holds it from admission until exhausted
or closed. Requests wait for it here, on an asyncio lock (first come, first served), not in
worker threads, so a waiting request holds no thread and the stream that holds the engine
always finds one for its next step. Engine calls run in Starlette's thread pool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from speculant import GenerationOptions
from speculant.serve.metrics import ServerMetrics

_END = object()


@dataclass
class Piece:
    """A text piece of a stream; the last one carries the result."""

    text: str
    result: Any = None


class Service:
    def __init__(self, engine: Any, model_name: str, defaults: GenerationOptions) -> None:
        self.engine = engine
        self.model_name = model_name
        self.defaults = defaults
        self.metrics = ServerMetrics(model_name)
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def _holding_engine(self):
        gauge = self.metrics
        gauge.waiting.labels(self.model_name).inc()
        try:
            await self._lock.acquire()
        finally:
            gauge.waiting.labels(self.model_name).dec()
        gauge.running.labels(self.model_name).inc()
        try:
            yield
        finally:
            gauge.running.labels(self.model_name).dec()
            self._lock.release()

    async def complete(self, call: Callable[[], Any]) -> Any:
        """Run ``call`` (``engine.generate`` / ``engine.chat``) to its result."""
        arrived = time.perf_counter()
        async with self._holding_engine():
            started = time.perf_counter()
            result = await run_in_threadpool(call)
        self.metrics.observe_finished(result, started - arrived + result.time_to_first_token_s,
                                      time.perf_counter() - arrived)
        return result

    async def stream(self, open_stream: Callable[[], Any]) -> AsyncIterator[Piece | None]:
        """Yield None once admitted (a bad request raises before that), then the pieces.

        Prime it with ``await gen.__anext__()`` before answering 200: then an admission
        error becomes a 4xx. Closing the generator early (the client went away) closes the
        engine's stream, which stops its decode and frees the engine.
        """
        arrived = time.perf_counter()
        first_at = None
        is_finished = False
        async with self._holding_engine():
            stream = await run_in_threadpool(open_stream)
            try:
                yield None
                pieces = iter(stream)
                while (text := await run_in_threadpool(next, pieces, _END)) is not _END:
                    first_at = first_at or time.perf_counter()
                    yield Piece(text)
                result, is_finished = stream.result, True
                self.metrics.observe_finished(result, (first_at or time.perf_counter()) - arrived,
                                              time.perf_counter() - arrived)
                yield Piece("", result)
            finally:
                stream.close()  # a no-op once exhausted
                if not is_finished:  # the client went away, or the decode failed
                    self.metrics.observe_aborted(time.perf_counter() - arrived)
