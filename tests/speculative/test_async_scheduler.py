"""`AsyncEngine` over the scheduler (aio.py: `submit`, `submit_stream`, `generate_many`) on the
tiny export pair written with ``batch=4``, CPU float32: requests from several asyncio tasks
are decoded together (passes of more than one row), each equal to its output alone; a
cancelled task's row is freed while the others go on; refusals raise before any piece.

Each test runs its event loop under a generous deadline (``asyncio.wait_for``), so a
regression that never ends fails instead of hanging the suite."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path

import pytest

import speculant
from export.export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS, write_tokenizer
from speculant import AsyncEngine, GenerationOptions, RequestError
from speculant_tools.export import write_pair_package

ROWS = 4
DEADLINE_S = 60
TEXTS = ["0123", "abc", "9:;<=", "ABAB", "@@@", "XYZ"]  # more than ROWS: some wait
MAX_NEW = [12, 8, 14, 6, 10, 9]


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[bool, Path]:
    base = tmp_path_factory.mktemp("async-scheduler")
    tokenizer = write_tokenizer(base / "tokenizer.json")
    return {batch: write_pair_package(base / f"pair-{batch}", TARGET_WEIGHTS, CONFIG,
                                      DRAFTER_WEIGHTS, tokenizer, graph="explicit",
                                      cache="static", **({"batch": ROWS} if batch else {}))
            for batch in (True, False)}


@pytest.fixture
def engine(roots) -> speculant.Engine:
    """A fresh batched engine per test, its passes' rows logged in ``engine.pass_rows``."""
    engine = speculant.load(roots[True], max_batch=ROWS)
    target, engine.pass_rows = engine.scheduler.target, []
    run = target.run

    def logged(blocks):
        engine.pass_rows.append(len(blocks))
        return run(blocks)
    target.run = logged
    return engine


def finished(main: Awaitable):
    return asyncio.run(asyncio.wait_for(main, DEADLINE_S))


def test_tasks_streaming_at_once_are_decoded_together_each_as_alone(engine):
    alone = [engine.generate(t, max_new_tokens=n) for t, n in zip(TEXTS, MAX_NEW, strict=True)]
    engine.pass_rows.clear()

    async def main():
        aengine = AsyncEngine(engine)

        async def text_of(i: int) -> tuple[str, speculant.Generation]:
            async with aengine.submit_stream(TEXTS[i], max_new_tokens=MAX_NEW[i]) as pieces:
                text = "".join([piece async for piece in pieces])
                return text, pieces.result

        async def ids_of(i: int) -> tuple[list[int], speculant.Generation]:
            handle = await aengine.submit(TEXTS[i], max_new_tokens=MAX_NEW[i])
            return [token async for token in handle], handle.result
        return await asyncio.gather(*(text_of(i) if i % 2 else ids_of(i)
                                      for i in range(len(TEXTS))))

    for i, (streamed, result) in enumerate(finished(main())):
        assert result.token_ids == alone[i].token_ids
        assert streamed == (alone[i].text if i % 2 else alone[i].token_ids)
    assert max(engine.pass_rows) > 1  # tasks shared passes
    assert sum(engine.pass_rows) == sum(len(r.token_ids) for r in alone)  # one row-step each
    assert not engine.scheduler.has_work


def test_async_generate_many_equals_the_synchronous_and_shares_passes(engine):
    options = [GenerationOptions(max_new_tokens=n, proposer="prompt_lookup", k=2)
               for n in MAX_NEW]
    expected = [engine.generate(t, o) for t, o in zip(TEXTS, options, strict=True)]
    engine.pass_rows.clear()

    async def main():
        aengine = AsyncEngine(engine)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)
        ticking = asyncio.create_task(ticker())
        many, streamed = await asyncio.gather(
            aengine.generate_many(TEXTS, options),
            _joined(aengine.submit_stream("0123", max_new_tokens=12)))
        ticking.cancel()
        return many, streamed, ticks

    many, streamed, ticks = finished(main())
    assert [r.token_ids for r in many] == [r.token_ids for r in expected]
    assert streamed == engine.generate("0123", max_new_tokens=12).text
    assert max(engine.pass_rows) == ROWS
    assert ticks > 3  # the loop ran between the worker's calls


async def _joined(opening) -> str:
    async with opening as pieces:
        return "".join([piece async for piece in pieces])


def test_a_cancelled_task_frees_its_row_and_the_others_go_on(engine):
    alone = engine.generate(TEXTS[1], max_new_tokens=40)

    async def main():
        aengine = AsyncEngine(engine)
        started = asyncio.Event()

        async def endless() -> None:
            async with aengine.submit_stream(TEXTS[0], max_new_tokens=50) as pieces:
                async for _ in pieces:
                    started.set()
        cancelled = asyncio.create_task(endless())
        other = asyncio.create_task(_joined(aengine.submit_stream(TEXTS[1],
                                                                  max_new_tokens=40)))
        await started.wait()
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        return await other

    assert finished(main()) == alone.text
    engine.scheduler.step()  # nothing left: the cancelled row left at a step
    assert engine.scheduler.rows == [None] * ROWS and not engine.scheduler.has_work


def test_refusals_raise_before_any_piece(engine, roots):
    async def main():
        aengine = AsyncEngine(engine)
        with pytest.raises(RequestError) as bad_prompt:
            await aengine.generate_many(["0123", [7, 10_000]], max_new_tokens=4)
        with pytest.raises(RequestError) as too_long:
            await aengine.submit("0123", max_new_tokens=500)
        lone = AsyncEngine(speculant.load(roots[False]))
        with pytest.raises(RequestError) as unbatched:
            await lone.submit_stream("0123", max_new_tokens=4)
        return bad_prompt.value, too_long.value, unbatched.value

    bad_prompt, too_long, unbatched = finished(main())
    assert bad_prompt.problems[0].path.startswith("prompts[1]")
    assert too_long.problems[0].path == "max_new_tokens"
    assert unbatched.problems[0].path == "batch"
    engine.scheduler.step()  # the first prompt, cancelled with the second, leaves
    assert not engine.scheduler.has_work
