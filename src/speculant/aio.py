"""`AsyncEngine`: an :class:`~speculant.engine.Engine` for asyncio.

Every engine call (admission, each decode step, close) runs on the async engine's one worker
thread, never on the event loop. Requests through one async engine (``generate``, ``stream``)
are served one at a time in arrival order, the wait being an asyncio wait (cancellable,
holding no thread); with the engine's own turns behind it, requests from other threads and
async engines keep their arrival order too. A package with a batched target graph also
decodes requests together (``submit``, ``submit_stream``, ``generate_many``: rows of the
engine's scheduler, as the server runs them): several tasks' requests share every step, each
worker call stepping every row, beside the one-at-a-time requests.

Cancelling a task stops its decode between two steps: the step under way finishes on the
worker, then the decode is closed and the engine is free; so does a task cancelled (or failed)
elsewhere while it holds an open stream. A stream left unfinished by the
task that opened it (``break`` out of ``async for``) is closed by that task's next request,
as the synchronous API closes a thread's own suspended stream; one that is garbage-collected
is closed then.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from speculant.engine import Engine, Messages, Prompt, is_prompt_list, of_prompt, results_of
from speculant.errors import RequestError, SpeculantError
from speculant.generation import BatchedDecode, Decode, Generation, Stream
from speculant.workflow.options import GenerationOptions

T = TypeVar("T")
STEP_SLICE_S = 0.05  # generate(): one worker call decodes this long before the loop checks in


class AsyncEngine:
    """``await``-able :meth:`generate` / :meth:`chat` / :meth:`generate_many` and
    async-iterable :meth:`stream` / :meth:`chat_stream` / :meth:`submit` /
    :meth:`submit_stream` over ``engine`` (their arguments are the engine's)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._worker = Worker()
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._current: AsyncStream | None = None  # the open stream, if any

    async def generate(self, prompt: Prompt | Sequence[Prompt],
                       options: GenerationOptions | int | None = None, /, *,
                       inputs: Mapping[str, np.ndarray] | None = None, **fields
                       ) -> Generation | list[Generation]:
        """:meth:`Engine.generate`, awaited; a list of prompts gives a list of results."""
        if is_prompt_list(prompt):
            results = []
            for i, one in enumerate(prompt):
                try:
                    results.append(await self.generate(one, options, inputs=inputs, **fields))
                except SpeculantError as error:
                    raise of_prompt(error, i) from error
            return results
        opened = await self._open(lambda: self.engine.decode(prompt, options, inputs=inputs,
                                                             **fields))
        async with opened:
            while not await opened.run(_advance_for, opened.decode, STEP_SLICE_S):
                pass
            return opened.decode.result

    async def chat(self, messages: Messages, options: GenerationOptions | int | None = None,
                   /, **fields) -> Generation:
        prompt, options = await asyncio.to_thread(self.engine.prepare_chat, messages, options,
                                                  **fields)
        return await self.generate(prompt, options)  # type: ignore[return-value]

    def stream(self, prompt: Prompt, options: GenerationOptions | int | None = None, /, *,
               inputs: Mapping[str, np.ndarray] | None = None, **fields) -> Opening:
        """Admit (a bad request raises here), then ``async for`` text pieces: ``pieces =
        await engine.stream(...)`` or ``async with engine.stream(...) as pieces``."""
        return Opening(self._open(lambda: self.engine.stream(prompt, options, inputs=inputs,
                                                             **fields)))

    def chat_stream(self, messages: Messages, options: GenerationOptions | int | None = None,
                    /, **fields) -> Opening:
        async def open_chat() -> AsyncStream:
            prompt, chat_options = await asyncio.to_thread(self.engine.prepare_chat, messages,
                                                           options, **fields)
            return await self._open(lambda: self.engine.stream(prompt, chat_options))
        return Opening(open_chat())

    # -- requests decoded together (the engine's scheduler) -------------------------------
    async def generate_many(self, prompts: Sequence[Prompt],
                            options: GenerationOptions | int | Sequence[GenerationOptions]
                            | None = None, /, *, inputs: Mapping[str, np.ndarray] | None = None,
                            **fields) -> list[Generation]:
        """:meth:`Engine.generate_many`, awaited: the prompts decoded together, with the other
        requests submitted to the scheduler meanwhile; cancelled, each of them is cancelled."""
        handles = await self.call(lambda: self.engine.submit_many(prompts, options,
                                                                  inputs=inputs, **fields))
        try:
            while not await self.call(lambda: _step_until_finished(handles, STEP_SLICE_S)):
                pass
        except BaseException:
            self._worker.submit(lambda: [handle.close() for handle in handles])
            raise
        return await self.call(lambda: results_of(handles))

    def submit(self, prompt: Prompt, options: GenerationOptions | int | None = None, /, *,
               inputs: Mapping[str, np.ndarray] | None = None, **fields) -> Opening:
        """:meth:`Engine.submit`: admit (a bad request raises here), queue it for a row of the
        scheduler, then ``async for`` its committed token ids; each ``next`` steps every row
        until this one has a token, so the requests of several tasks decode together."""
        return Opening(self._open_row(lambda: self.engine.submit(prompt, options,
                                                                 inputs=inputs, **fields)))

    def submit_stream(self, prompt: Prompt, options: GenerationOptions | int | None = None,
                      /, *, inputs: Mapping[str, np.ndarray] | None = None,
                      **fields) -> Opening:
        """:meth:`submit`, iterated for text pieces as :meth:`stream`'s are."""
        return Opening(self._open_row(lambda: self.engine.submit_stream(
            prompt, options, inputs=inputs, **fields)))

    async def _open_row(self, open_call: Callable[[], BatchedDecode | Stream]) -> AsyncStream:
        made: list[BatchedDecode | Stream] = []
        try:
            opened = await self.call(lambda: made.append(open_call()) or made[0])
        except BaseException:  # refused, or cancelled while the worker admits it
            self._worker.submit(lambda: made and made[0].close())
            raise
        return AsyncStream(self, opened, None)

    def close(self) -> None:
        """Stop the worker thread once its queued calls are done (the engine stays usable)."""
        self._worker.stop()

    def __del__(self) -> None:
        self._worker.stop()

    # -- one request at a time ------------------------------------------------------------
    async def _open(self, open_call: Callable[[], Decode | Stream]) -> AsyncStream:
        current = self._current
        if current is not None and current.owner is asyncio.current_task():
            await current.aclose(superseded=True)  # its own suspended stream: never resumed
        lock = self._lock_of_this_loop()
        await lock.acquire()
        made: list[Decode | Stream] = []
        try:
            opened = await self.call(lambda: made.append(open_call()) or made[0])
        except BaseException:  # refused, or cancelled while the worker admits it
            self._worker.submit(lambda: made and made[0].close())
            lock.release()
            raise
        self._current = AsyncStream(self, opened, lock)
        return self._current

    async def call(self, call: Callable[[], T]) -> T:
        """``call()`` on the worker thread. A cancelled await leaves the call running."""
        return await self._worker.run(call)

    def call_then(self, call: Callable[[], object], then: Callable[[], object]) -> None:
        """``call()`` on the worker thread after the calls queued before it, nobody waiting;
        ``then()`` on the running event loop once it has returned or raised."""
        loop = asyncio.get_running_loop()

        def run() -> None:
            try:
                call()
            finally:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                    loop.call_soon_threadsafe(then)
        self._worker.submit(run)

    def _lock_of_this_loop(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock


class Worker:
    """One daemon thread running calls in submission order (a call that never returns cannot
    keep the process alive at exit)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="speculant-aio", daemon=True).start()

    async def run(self, call: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._calls.put((call, future, loop))
        return await future

    def submit(self, call: Callable[[], object]) -> None:
        """Run ``call()`` after the calls queued before it; nobody waits for it."""
        self._calls.put((call, None, None))

    def stop(self) -> None:
        self._calls.put((None, None, None))

    def _serve(self) -> None:
        while True:
            call, future, loop = self._calls.get()
            if call is None:
                return
            try:
                outcome, error = call(), None
            except BaseException as raised:  # noqa: BLE001 - handed to the awaiting task
                outcome, error = None, raised
            if future is not None:
                try:
                    loop.call_soon_threadsafe(_settle, future, outcome, error)
                except RuntimeError:  # the loop is closed: nobody is waiting
                    pass


def _settle(future: asyncio.Future, outcome: object, error: BaseException | None) -> None:
    if future.done():  # the awaiting task was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(outcome)


class Opening:
    """An async stream being admitted: ``await`` it, or enter it with ``async with``."""

    def __init__(self, opening: Any) -> None:
        self._opening = opening
        self._stream: AsyncStream | None = None

    def __await__(self) -> Generator[Any, None, AsyncStream]:
        return self._opening.__await__()

    async def __aenter__(self) -> AsyncStream:
        self._stream = await self._opening
        return self._stream

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._stream is not None
        await self._stream.aclose()


class AsyncStream:
    """An admitted request of an :class:`AsyncEngine`: ``async for`` its pieces (text for
    ``stream``, token ids for a decode), ``result`` once finished; ``aclose()`` or leaving
    ``async with`` stops it. ``lock``: the one-at-a-time requests' (None: a scheduler row)."""

    def __init__(self, owner_engine: AsyncEngine, opened: Decode | BatchedDecode | Stream,
                 lock: asyncio.Lock | None) -> None:
        self._engine, self._opened, self._lock = owner_engine, opened, lock
        self.decode = opened.decode if isinstance(opened, Stream) else opened
        self._is_done = self._is_superseded = False
        self._loop = asyncio.get_running_loop()
        self.owner: asyncio.Task | None = None  # the task that opened or last advanced it
        self._take_owner()

    def _take_owner(self) -> None:
        """The current task owns the stream now; cancelled or failed, it closes it."""
        task = asyncio.current_task()
        if task is not self.owner and task is not None:
            task.add_done_callback(self._on_owner_done)
        self.owner = task

    def _on_owner_done(self, task: asyncio.Task) -> None:
        if task is self.owner and (task.cancelled() or task.exception() is not None):
            self._abandon()

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> Any:
        if self._is_superseded:
            raise RequestError("this stream was closed when the task that left it unfinished "
                               "sent the engine its next request", path="stream",
                               remedy="finish or aclose() a stream before the task's next "
                                      "request (async with engine.stream(...) as pieces: ...)")
        self._take_owner()
        is_exhausted, piece = await self.run(_next_of, self._opened)
        if is_exhausted:
            await self.aclose()
            raise StopAsyncIteration
        return piece

    async def run(self, step: Callable[..., T], *args: Any) -> T:
        """``step(*args)`` on the worker; cancelled or failed, the decode is closed once the
        step under way returns."""
        if self._is_done:
            raise RequestError("this stream is closed", path="stream")
        try:
            return await self._engine.call(lambda: step(*args))
        except BaseException:
            self._abandon()
            raise

    async def aclose(self, *, superseded: bool = False) -> None:
        if not self._is_done:
            self._is_superseded = superseded
            try:
                await self._engine.call(self._opened.close)
            finally:
                self._release()

    @property
    def result(self) -> Generation:
        if isinstance(self.decode, BatchedDecode) and not self.decode.is_finished:
            raise RequestError("the request has not finished", path="result",
                               remedy="iterate it to the end first")  # reading it would step
        return self._opened.result

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _abandon(self) -> None:
        """Close the decode behind the worker's current call and give the engine back."""
        if not self._is_done:
            self._engine._worker.submit(self._opened.close)
            self._release()

    def _release(self) -> None:
        """Give the async engine back to its next request (from any thread, once)."""
        if self._is_done:
            return
        self._is_done = True
        if self._engine._current is self:
            self._engine._current = None
        if self._lock is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._lock.release)
        except RuntimeError:  # the loop is closed: nobody waits on its lock
            pass

    def __del__(self) -> None:  # an abandoned stream must not hold the engine
        try:
            self._abandon()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _next_of(pieces: Decode | Stream) -> tuple[bool, Any]:
    """(exhausted, the next item)."""
    for piece in pieces:
        return False, piece
    return True, None


def _step_until_finished(handles: Sequence[BatchedDecode], seconds: float) -> bool:
    """Step the handles' scheduler for ``seconds``; whether every handle is finished."""
    until = time.perf_counter() + seconds
    while not all(handle.is_finished for handle in handles):
        if time.perf_counter() >= until:
            return False
        handles[0].scheduler.step()
    return True


def _advance_for(decode: Decode, seconds: float) -> bool:
    """Decode for ``seconds`` at least one step; whether it is finished."""
    until = time.perf_counter() + seconds
    for _ in decode:
        if time.perf_counter() >= until:
            return False
    return True
