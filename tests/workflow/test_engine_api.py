"""The Python API around a request: `Stream` as a context manager, abandoned streams that never
deadlock the engine, `generate` over a list of prompts, and `AsyncEngine` (asyncio).

Every test that could hang if the engine deadlocked runs its body in a daemon thread joined
with a generous deadline, so a regression fails instead of hanging the suite."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable

import pytest

import speculant
from speculant import AsyncEngine, RequestError

DEADLINE_S = 60  # generous: the machine may be loaded; a deadlock never ends at all
PROMPT = "def "


def within_deadline(body: Callable[[], object]) -> object:
    """``body()`` on a daemon thread (so the same thread does everything it does); its
    result, or a failure when it has not returned by the deadline."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = body()
        except BaseException as error:  # noqa: BLE001 - re-raised in the test
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), f"no answer in {DEADLINE_S} s: the engine deadlocked"
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome.get("value")


@pytest.fixture
def engine(decoder_package) -> speculant.Engine:
    """A fresh engine per test: one a regression left deadlocked fails only its own test."""
    return speculant.load(decoder_package("float32", "onnx"))


def test_leaving_a_with_block_closes_the_stream_and_frees_the_engine(engine):
    expected = engine.generate(PROMPT, 20)

    def body():
        with engine.stream(PROMPT, 20) as pieces:
            head = next(pieces)
        assert pieces.result.stats.stop_reason == "closed"
        after = threading.Thread(target=lambda: engine.generate(PROMPT, 20))
        after.start()  # another thread is served at once: the block gave the engine back
        after.join(DEADLINE_S)
        assert not after.is_alive()
        return head
    head = within_deadline(body)
    assert expected.text.startswith(head)


def test_break_out_of_a_kept_stream_then_generate_on_the_same_thread(engine):
    """The review's deadlock: ``for piece in stream: break`` keeps the stream (and the
    engine's turn); the same thread's next request used to wait for it forever."""
    expected = engine.generate(PROMPT, 20)

    def body():
        stream = engine.stream(PROMPT, 20)
        for _ in stream:
            break
        again = engine.generate(PROMPT, 20)
        return stream, again
    stream, again = within_deadline(body)
    assert again.token_ids == expected.token_ids
    assert stream.result.stats.stop_reason == "closed"
    with pytest.raises(RequestError, match="closed when the thread"):
        next(stream)  # resuming a superseded stream says so instead of ending quietly


def test_a_kept_decode_is_closed_by_its_threads_next_stream(engine):
    expected = "".join(engine.stream(PROMPT, 12))

    def body():
        decode = engine.decode(PROMPT, 12)
        next(decode)
        return "".join(engine.stream(PROMPT, 12))
    assert within_deadline(body) == expected


def test_a_collected_stream_frees_the_engine_for_another_thread(engine):
    expected = engine.generate(PROMPT, 10).token_ids

    def body():
        stream = engine.stream(PROMPT, 10)
        next(stream)
        del stream
        gc.collect()
        results: list[list[int]] = []
        other = threading.Thread(target=lambda: results.append(
            engine.generate(PROMPT, 10).token_ids))
        other.start()
        other.join(DEADLINE_S)
        return results
    assert within_deadline(body) == [expected]


def test_another_threads_open_stream_is_still_waited_for(engine):
    """Only the holder's own next request closes its stream: another thread waits its turn
    (the stream may be consumed meanwhile), then is served."""
    expected = engine.generate(PROMPT, 10).token_ids

    def body():
        stream = engine.stream(PROMPT, 10)
        next(stream)
        later: list[list[int]] = []
        waiter = threading.Thread(target=lambda: later.append(
            engine.generate(PROMPT, 10).token_ids))
        waiter.start()
        waiter.join(0.2)
        was_waiting = waiter.is_alive() and later == []
        rest = list(stream)
        waiter.join(DEADLINE_S)
        return was_waiting, rest, later
    was_waiting, rest, later = within_deadline(body)
    assert was_waiting and rest and later == [expected]


def test_a_list_of_prompts_gives_each_prompts_own_result(engine):
    prompts = ["def ", "hello world", [5, 6, 7]]
    one_by_one = [engine.generate(p, 12) for p in prompts]
    together = engine.generate(prompts, 12)
    assert isinstance(together, list) and len(together) == 3
    assert [r.token_ids for r in together] == [r.token_ids for r in one_by_one]
    assert [r.text for r in together] == [r.text for r in one_by_one]
    assert engine.generate((PROMPT,), 12)[0].token_ids == one_by_one[0].token_ids


def test_a_bad_prompt_in_a_list_names_its_index(engine):
    with pytest.raises(RequestError, match=r"prompts\[1\]"):
        engine.generate(["def ", [10**9]], 4)
    assert engine.generate([3, 4], 4).num_prompt_tokens == 2  # flat ids: one prompt


def test_async_generate_and_stream_equal_the_synchronous_api(engine):
    expected = engine.generate(PROMPT, 20)
    texts = engine.generate(["a", "def "], 8)

    async def main():
        aengine = AsyncEngine(engine)
        result = await aengine.generate(PROMPT, 20)
        pieces = [piece async for piece in await aengine.stream(PROMPT, 20)]
        async with aengine.stream(PROMPT, 20) as stream:
            first = [piece async for piece in stream]
        listed = await aengine.generate(["a", "def "], 8)
        with pytest.raises(RequestError, match=r"prompts\[1\]"):
            await aengine.generate(["a", [10**9]], 4)
        return result, pieces, first, stream.result, listed
    result, pieces, first, streamed, listed = within_deadline(lambda: asyncio.run(main()))
    assert result.token_ids == expected.token_ids
    assert "".join(pieces) == "".join(first) == expected.text == streamed.text
    assert [r.token_ids for r in listed] == [r.token_ids for r in texts]


def test_async_steps_leave_the_event_loop_free(engine):
    """While a request decodes, other coroutines run: the loop ticks between its steps."""
    async def main():
        aengine = AsyncEngine(engine)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)
        task = asyncio.create_task(ticker())
        pieces = [piece async for piece in await aengine.stream(PROMPT, 30)]
        task.cancel()
        return ticks, pieces
    ticks, pieces = within_deadline(lambda: asyncio.run(main()))
    assert len(pieces) > 1 and ticks >= len(pieces)


def test_cancelling_a_task_stops_its_decode_between_steps(engine):
    expected = engine.generate(PROMPT, 40)

    async def main():
        aengine = AsyncEngine(engine)
        taken: list[str] = []
        started = asyncio.Event()

        async def consume():
            async for piece in await aengine.stream(PROMPT, 40):
                taken.append(piece)
                started.set()
                await asyncio.sleep(0.01)
        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await aengine.generate(PROMPT, 40)  # the engine is free again
        return taken, after
    taken, after = within_deadline(lambda: asyncio.run(main()))
    assert 0 < len(taken) and len("".join(taken)) < len(expected.text)
    assert after.token_ids == expected.token_ids


def test_a_task_that_breaks_out_of_a_stream_can_ask_again(engine):
    expected = engine.generate(PROMPT, 20)

    async def main():
        aengine = AsyncEngine(engine)
        stream = await aengine.stream(PROMPT, 20)
        async for _ in stream:
            break
        again = await aengine.generate(PROMPT, 20)
        with pytest.raises(RequestError, match="closed when the task"):
            await stream.__anext__()
        return again
    assert within_deadline(lambda: asyncio.run(main())).token_ids == expected.token_ids


def test_async_requests_are_served_in_arrival_order(engine):
    prompts = ["a", "def ", "hello world"]
    expected = [engine.generate(p, 10).token_ids for p in prompts]

    async def main():
        aengine = AsyncEngine(engine)
        return await asyncio.gather(*(aengine.generate(p, 10) for p in prompts))
    results = within_deadline(lambda: asyncio.run(main()))
    assert [r.token_ids for r in results] == expected


def test_an_async_admission_error_raises_before_any_piece(engine):
    async def main():
        aengine = AsyncEngine(engine)
        with pytest.raises(RequestError):
            await aengine.stream(PROMPT, 0)
        return (await aengine.generate(PROMPT, 4)).token_ids
    assert within_deadline(lambda: asyncio.run(main())) == engine.generate(PROMPT, 4).token_ids
