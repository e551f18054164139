"""`speculant serve --max-batch N` over real sockets (docs/serving.md): concurrent requests are
decoded together by the engine's scheduler (rows of one batched pass per step), each answer
equal to the request's answer alone, streamed or not; a package without a batched graph is
refused at start-up."""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import speculant
from export.export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS, write_tokenizer
from speculant.errors import RequestError
from speculant.serve import load_engine
from speculant.serve.app import create_app
from speculant.serve.limits import ServerLimits
from speculant_tools.export import write_pair_package

ROWS = 4
MODEL = "pair"
PROMPTS = ["0123", "abc", "9:;<=", "ABAB", "@@@", "XYZ"]
MAX_TOKENS = [18, 12, 20, 9, 15, 11]


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("batched-serve")
    tokenizer = write_tokenizer(base / "tokenizer.json")
    return {batch: write_pair_package(base / f"pair-{batch}", TARGET_WEIGHTS, CONFIG,
                                      DRAFTER_WEIGHTS, tokenizer, graph="explicit",
                                      cache="static", **({"batch": ROWS} if batch else {}))
            for batch in (True, False)}


@pytest.fixture(scope="module")
def served(roots, serve_app):
    """The batched pair served with --max-batch 4, its engine, and the widest pass seen."""
    engine = load_engine(str(roots[True]), max_batch=ROWS)
    limits = ServerLimits(max_batch=ROWS)
    app = create_app(engine, MODEL, limits=limits)
    widest: list[int] = [0]
    target = engine.scheduler.target
    run = target.run

    def counted(blocks):
        widest[0] = max(widest[0], len(blocks))
        return run(blocks)

    target.run = counted
    return serve_app(app, limits), engine, widest


def post(base: str, body: dict) -> tuple[int, bytes]:
    where = urlsplit(base)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
    try:
        connection.request("POST", "/v1/completions", json.dumps({"model": MODEL, **body}),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def streamed_text(answer: bytes) -> str:
    events = [line[len(b"data: "):] for line in answer.splitlines()
              if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    return "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])


def together(base: str, is_streamed: bool) -> list[tuple[int, bytes]]:
    """Every prompt sent at once, one thread each."""
    answers: list = [None] * len(PROMPTS)
    start = threading.Barrier(len(PROMPTS))

    def send(i: int) -> None:
        start.wait()
        answers[i] = post(base, {"prompt": PROMPTS[i], "max_tokens": MAX_TOKENS[i],
                                 "temperature": 0, "stream": is_streamed})

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return answers


@pytest.mark.parametrize("is_streamed", [True, False])
def test_concurrent_requests_are_decoded_together_each_as_alone(served, is_streamed):
    base, engine, widest = served
    alone = [engine.generate(p, max_new_tokens=n).text
             for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)]
    widest[0] = 0
    for (status, answer), expected in zip(together(base, is_streamed), alone, strict=True):
        assert status == 200, answer
        text = streamed_text(answer) if is_streamed else \
            json.loads(answer)["choices"][0]["text"]
        assert text == expected
    assert widest[0] > 1  # rows shared a pass
    assert engine.scheduler.rows == [None] * ROWS or not any(
        e is not None and not e.state.is_stopped for e in engine.scheduler.rows)


def test_max_batch_needs_a_batched_graph(roots):
    engine = speculant.load(roots[False])
    with pytest.raises(RequestError) as caught:
        create_app(engine, MODEL, limits=ServerLimits(max_batch=2))
    assert caught.value.problems[0].path == "batch"
    create_app(engine, MODEL, limits=ServerLimits(max_batch=1))  # one at a time: served
