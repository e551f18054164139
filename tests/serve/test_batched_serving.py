"""`speculant serve --max-batch N` over real sockets (docs/serving.md): concurrent requests are
decoded together by the engine's scheduler (rows of one batched pass per step), each answer
equal to the request's answer alone, streamed or not; /metrics counts the steps' rows, the
rows in use and their cache positions, the queue time and the time per output token; a
package without a batched graph is refused at start-up."""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

import speculant
from export.export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS, write_tokenizer
from speculant.errors import RequestError
from speculant.serve import load_engine
from speculant.serve.app import create_app
from speculant.serve.limits import ServerLimits
from speculant_tools.export import write_pair_package

ROWS = 4  # conftest.BATCHED_ROWS, the batched_pair's rows
MODEL = "pair"
PROMPTS = ["0123", "abc", "9:;<=", "ABAB", "@@@", "XYZ"]
MAX_TOKENS = [18, 12, 20, 9, 15, 11]


@pytest.fixture(scope="module")
def roots(tmp_path_factory, batched_pair) -> dict[bool, Path]:
    base = tmp_path_factory.mktemp("batched-serve")
    tokenizer = write_tokenizer(base / "tokenizer.json")
    return {True: batched_pair, False: write_pair_package(
        base / "pair", TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS, tokenizer, graph="explicit",
        cache="static")}


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


def scraped(base: str) -> dict[tuple, float]:
    """/metrics' samples by (name, labels but the model's)."""
    where = urlsplit(base)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
    try:
        connection.request("GET", "/metrics")
        body = connection.getresponse().read().decode()
    finally:
        connection.close()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))):
            s.value for family in text_string_to_metric_families(body) for s in family.samples}


def streamed_text(answer: bytes) -> str:
    events = [line[len(b"data: "):] for line in answer.splitlines()
              if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    return "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])


def together(base: str, is_streamed: bool | None) -> list[tuple[int, bytes]]:
    """Every prompt sent at once, one thread each (``is_streamed`` None: every other one)."""
    answers: list = [None] * len(PROMPTS)
    start = threading.Barrier(len(PROMPTS))

    def send(i: int) -> None:
        start.wait()
        answers[i] = post(base, {"prompt": PROMPTS[i], "max_tokens": MAX_TOKENS[i],
                                 "temperature": 0,
                                 "stream": i % 2 == 0 if is_streamed is None else is_streamed})

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


def test_metrics_count_the_steps_rows_and_cache_positions(served, monkeypatch):
    """Six requests through four rows, streamed and not: one ``batch_size`` observation per
    pass, summing to the tokens generated (one per row per step without drafts: the prompt's
    step gives the first); mid-decode, the rows in use and their cache positions are the held
    pass's rows and starts; afterwards none."""
    base, engine, _ = served
    alone = [engine.generate(p, max_new_tokens=n) for p, n in zip(PROMPTS, MAX_TOKENS,
                                                                  strict=True)]
    target = engine.scheduler.target
    run, sizes, blocks = target.run, [], []  # each pass's rows; the held pass's blocks
    held, release = threading.Event(), threading.Event()

    def holding(these):
        sizes.append(len(these))
        if not held.is_set() and len(these) > 1 and all(len(b.tokens) == 1 for b in these):
            blocks.extend(these)  # rows decoding, none prefilling
            held.set()
            release.wait(timeout=60)
        return run(these)

    monkeypatch.setattr(target, "run", holding)
    before = scraped(base)
    answers: list = []
    sender = threading.Thread(target=lambda: answers.extend(together(base, None)))
    sender.start()
    assert held.wait(timeout=60), "no pass had two decoding rows"
    during = scraped(base)
    release.set()
    sender.join(timeout=120)
    after = scraped(base)

    def moved(name: str, **labels) -> float:
        key = (f"speculant:{name}", tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    def now(samples: dict, name: str) -> float:
        return samples[(f"speculant:{name}", ())]

    assert [status for status, _ in answers] == [200] * len(PROMPTS)
    assert now(during, "num_rows_used") == len(blocks)
    assert now(during, "kv_slots_used") == sum(block.start for block in blocks)
    assert now(after, "num_rows_used") == now(after, "kv_slots_used") == 0
    assert now(after, "kv_slots_total") == ROWS * target.capacity
    num_tokens = sum(len(result.token_ids) for result in alone)
    assert moved("generation_tokens_total") == num_tokens
    assert moved("batch_size_count") == len(sizes)
    assert moved("batch_size_sum") == sum(sizes) == num_tokens
    assert moved("batch_size_bucket", le=f"{ROWS}.0") == len(sizes)
    assert moved("batch_size_bucket", le="1.0") < len(sizes)  # rows shared passes
    assert moved("request_queue_time_seconds_count") == len(PROMPTS)
    assert moved("request_time_per_output_token_seconds_count") == len(PROMPTS)
    assert 0 < moved("request_time_per_output_token_seconds_sum") < \
        moved("e2e_request_latency_seconds_sum")


def test_max_batch_needs_a_batched_graph(roots):
    engine = speculant.load(roots[False])
    with pytest.raises(RequestError) as caught:
        create_app(engine, MODEL, limits=ServerLimits(max_batch=2))
    assert caught.value.problems[0].path == "batch"
    create_app(engine, MODEL, limits=ServerLimits(max_batch=1))  # one at a time: served
