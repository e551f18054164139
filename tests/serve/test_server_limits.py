"""The server under abuse, over real sockets to a uvicorn server started as `speculant serve`
starts it (ServerLimits: the guarded protocol, uvicorn's settings) on the demo package: a
half-sent body, slow headers, a flood of idle connections, a full queue, deadlines, abandoned
non-streamed requests, a stuck engine on /health, and the token budget; the full queue and the
deadlines also with ``--max-batch`` (conftest's batched pair, its scheduler's passes gated).
Each test serves its own app with its own small limits; the deadlines are seconds, far above
what a step takes."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from speculant.serve import load_engine
from speculant.serve.app import create_app
from speculant.serve.limits import ServerLimits

MODEL = "demo"
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def demo():
    return load_engine("demo")


class GatedEngine:
    """The engine, each decode step slowed by ``step_s`` and held while ``gate`` is shut;
    every decode's progress is logged in ``decodes`` (num_pieces, is_closed)."""

    def __init__(self, engine, step_s: float = 0.0) -> None:
        self.engine, self.step_s = engine, step_s
        self.gate = threading.Event()
        self.gate.set()
        self.decodes: list[dict] = []

    def stream(self, prompt, options):
        return self._gated(self.engine.stream(prompt, options))

    def decode(self, prompt, options):
        return self._gated(self.engine.decode(prompt, options))

    def _gated(self, inner):
        log = {"num_pieces": 0, "is_closed": False}
        self.decodes.append(log)
        engine = self

        class Gated:
            result = property(lambda _: inner.result)

            def __iter__(self):
                for piece in inner:
                    engine.gate.wait()
                    time.sleep(engine.step_s)
                    log["num_pieces"] += 1
                    yield piece

            def close(self):
                log["is_closed"] = True
                inner.close()
        return Gated()

    def __getattr__(self, name):
        return getattr(self.engine, name)


class GatedPasses:
    """A batched engine (``max_batch`` rows) whose scheduler's passes are each slowed by
    ``step_s`` and held while ``gate`` is shut; ``starts`` logs each pass's row starts."""

    def __init__(self, root, max_batch: int, step_s: float = 0.0) -> None:
        self.engine = load_engine(str(root), max_batch=max_batch)
        self.step_s, self.gate, self.starts = step_s, threading.Event(), []
        self.gate.set()
        target = self.engine.scheduler.target
        run = target.run

        def gated(blocks):
            self.gate.wait()
            time.sleep(self.step_s)
            self.starts.append([block.start for block in blocks])
            return run(blocks)
        target.run = gated

    @property
    def num_rows_decoding(self) -> int:
        return sum(e is not None and not e.state.is_stopped for e in self.engine.scheduler.rows)


def _served(serve_app, engine, **limits) -> tuple[str, object]:
    app = create_app(engine, MODEL, limits=ServerLimits(**limits))
    return serve_app(app, ServerLimits(**limits)), app.state.service


def _where(base: str) -> tuple[str, int]:
    parts = urlsplit(base)
    return parts.hostname, parts.port


def _post(base: str, body: dict, timeout: float = 30) -> tuple[int, Any, bytes]:
    connection = http.client.HTTPConnection(*_where(base), timeout=timeout)
    try:
        connection.request("POST", "/v1/completions", json.dumps({"model": MODEL, **body}),
                           JSON)
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def _get(base: str, path: str) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(*_where(base), timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed."""
    sock.settimeout(timeout)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received, time.monotonic()


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_a_half_sent_body_is_408_and_the_connection_closed(serve_app, demo):
    base, _ = _served(serve_app, demo, body_timeout_s=1.0)
    started = time.monotonic()
    with socket.create_connection(_where(base)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 100\r\n\r\n{")
        answer, closed_at = _read_until_closed(sock, timeout=10)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert b"did not arrive within 1 s" in answer
    assert 0.9 < closed_at - started < 5
    assert _post(base, {"prompt": "def f(x):", "max_tokens": 4})[0] == 200  # still serving


@pytest.mark.parametrize("trickle", [False, True])
def test_slow_headers_are_dropped(serve_app, demo, trickle):
    base, _ = _served(serve_app, demo, header_timeout_s=1.0)
    started = time.monotonic()
    with socket.create_connection(_where(base)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\n")
        try:
            for byte in b"X-Slow: " + b"x" * 50 if trickle else b"":  # a byte every 0.2 s
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
            answer, closed_at = _read_until_closed(sock, timeout=10)
        except (BrokenPipeError, ConnectionResetError):
            answer, closed_at = b"", time.monotonic()
    assert answer == b"" and 0.9 < closed_at - started < 5.0


def test_a_flood_of_idle_connections_beyond_the_limit_is_refused(serve_app, demo):
    base, _ = _served(serve_app, demo, max_connections=8, retry_after_s=3)
    idle = [socket.create_connection(_where(base)) for _ in range(8)]
    try:
        for sock in idle:
            sock.sendall(b"GET /health HTT")  # half a request line, then nothing
        time.sleep(0.2)
        refused = [socket.create_connection(_where(base)) for _ in range(20)]
        for sock in refused:
            answer, _ = _read_until_closed(sock, timeout=10)
            sock.close()
            assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 3" in answer
            assert b"too_many_connections" in answer
    finally:
        for sock in idle:
            sock.close()
    _wait_for(lambda: _get(base, "/health")[0] == 200)  # the slots are free again


def test_a_full_queue_is_429_with_retry_after(serve_app, demo):
    engine = GatedEngine(demo)
    base, service = _served(serve_app, engine, max_waiting=1, retry_after_s=7)
    engine.gate.clear()  # the first request holds the engine until the gate opens
    answers: list[int] = []
    clients = [threading.Thread(target=lambda: answers.append(
        _post(base, {"prompt": "def f(x):", "max_tokens": 4})[0])) for _ in range(2)]
    clients[0].start()
    _wait_for(lambda: len(service.admission.running) == 1)
    clients[1].start()
    _wait_for(lambda: service.admission.num_waiting == 1)
    status, headers, body = _post(base, {"prompt": "x", "max_tokens": 4})
    assert status == 429 and headers["Retry-After"] == "7"
    assert json.loads(body)["error"]["code"] == "queue_full"
    engine.gate.set()
    for client in clients:
        client.join(timeout=30)
    assert answers == [200, 200]


def test_a_request_past_its_deadline_stops_between_steps(serve_app, demo):
    engine = GatedEngine(demo, step_s=0.02)  # 500 tokens: 10 s, over the 1 s deadline
    base, service = _served(serve_app, engine, request_timeout_s=1.0)
    started = time.monotonic()
    status, _, body = _post(base, {"prompt": "def f(x):", "max_tokens": 500})
    assert status == 504 and json.loads(body)["error"]["code"] == "deadline_exceeded"
    assert time.monotonic() - started < 5
    _wait_for(lambda: engine.decodes[-1]["is_closed"])
    assert engine.decodes[-1]["num_pieces"] < 250

    status, _, body = _post(base, {"prompt": "def f(x):", "max_tokens": 500, "stream": True})
    events = [e.removeprefix("data: ") for e in body.decode().split("\n\n") if e]
    assert status == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "deadline_exceeded"
    _wait_for(lambda: engine.decodes[-1]["is_closed"])
    metrics = service.metrics
    assert metrics.requests.labels(MODEL, "timeout")._value.get() == 2
    assert metrics.errors.labels(MODEL, "504")._value.get() == 2
    assert _post(base, {"prompt": "def f(x):", "max_tokens": 4})[0] == 200


def test_an_abandoned_non_streamed_request_stops_decoding(serve_app, demo):
    engine = GatedEngine(demo, step_s=0.02)
    base, service = _served(serve_app, engine)
    with socket.create_connection(_where(base)) as sock:
        body = json.dumps({"model": MODEL, "prompt": "def f(x):", "max_tokens": 400}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        _wait_for(lambda: engine.decodes and engine.decodes[-1]["num_pieces"] > 0)
    # the client is gone; the decode stops at its next step
    _wait_for(lambda: engine.decodes[-1]["is_closed"])
    assert engine.decodes[-1]["num_pieces"] < 200
    assert service.metrics.requests.labels(MODEL, "abort")._value.get() == 1
    assert _post(base, {"prompt": "def f(x):", "max_tokens": 4})[0] == 200


def test_health_reports_a_stuck_engine(serve_app, demo):
    engine = GatedEngine(demo)
    base, _ = _served(serve_app, engine, request_timeout_s=1.0, stall_grace_s=1.0)
    assert _get(base, "/health")[0] == 200
    engine.gate.clear()  # the next step never returns, until the gate opens
    assert _post(base, {"prompt": "def f(x):", "max_tokens": 4})[0] == 504
    _wait_for(lambda: _get(base, "/health")[0] == 503)
    status, answer = _get(base, "/health")
    assert answer["status"] == "stalled" and "past its deadline" in answer["reason"]
    engine.gate.set()
    _wait_for(lambda: _get(base, "/health")[0] == 200)
    assert _post(base, {"prompt": "def f(x):", "max_tokens": 4})[0] == 200


def test_max_tokens_left_out_is_the_remaining_context(serve_app, demo):
    base, _ = _served(serve_app, demo)
    context = demo.package.plan.context_cap
    prompt = "def f(x):\n    return x\n" * 45  # leaves room for about 100 tokens
    num_prompt = len(demo.tokenizer.encode(prompt))
    assert 64 < context - num_prompt < 200
    status, _, body = _post(base, {"prompt": prompt}, timeout=60)
    usage, choice = json.loads(body)["usage"], json.loads(body)["choices"][0]
    assert status == 200 and usage["prompt_tokens"] == num_prompt
    assert usage["completion_tokens"] > 64  # not GenerationOptions' 64
    assert choice["finish_reason"] == "stop" or usage["total_tokens"] == context


def test_max_tokens_is_capped_by_the_server(serve_app, demo):
    base, _ = _served(serve_app, demo, max_tokens=6)
    for asked in ({}, {"max_tokens": 100}):
        status, _, body = _post(base, {"prompt": "def f(x):", **asked})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] <= 6
        assert json.loads(body)["choices"][0]["finish_reason"] == "length"


def _text(body: bytes, is_streamed: bool) -> str:
    if not is_streamed:
        return json.loads(body)["choices"][0]["text"]
    events = [e.removeprefix("data: ") for e in body.decode().split("\n\n") if e]
    return "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])


def test_a_full_queue_is_429_with_retry_after_with_max_batch(serve_app, batched_pair):
    passes = GatedPasses(batched_pair, max_batch=2)
    base, service = _served(serve_app, passes.engine, max_batch=2, max_waiting=1,
                            retry_after_s=7)
    prompts = ["0123", "abc", "ABAB"]
    alone = [passes.engine.generate(p, max_new_tokens=6).text for p in prompts]
    passes.gate.clear()  # the first pass holds the engine until the gate opens
    answers: dict[int, tuple] = {}

    def send(i: int) -> None:
        answers[i] = _post(base, {"prompt": prompts[i], "max_tokens": 6, "temperature": 0,
                                  "stream": i == 1})
    clients = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    for client in clients[:2]:  # two rows running
        client.start()
    _wait_for(lambda: len(service.admission.running) == 2)
    clients[2].start()  # one waiting
    _wait_for(lambda: service.admission.num_waiting == 1)
    status, headers, body = _post(base, {"prompt": "x", "max_tokens": 4})
    assert status == 429 and headers["Retry-After"] == "7"
    assert json.loads(body)["error"]["code"] == "queue_full"
    passes.gate.set()
    for client in clients:
        client.join(timeout=60)
    assert [answers[i][0] for i in range(3)] == [200] * 3
    assert [_text(answers[i][2], i == 1) for i in range(3)] == alone
    assert service.metrics.errors.labels(MODEL, "429")._value.get() == 1


@pytest.mark.parametrize("is_streamed", [False, True])
def test_a_request_past_its_deadline_leaves_its_row_with_max_batch(serve_app, batched_pair,
                                                                    is_streamed):
    """A long request (about 55 passes of 0.1 s) past its 1.5 s deadline gets 504 (streamed:
    a last error event) and its row is freed, while a short one decoded beside it is
    answered as alone."""
    passes = GatedPasses(batched_pair, max_batch=2, step_s=0.1)
    base, service = _served(serve_app, passes.engine, max_batch=2, request_timeout_s=1.5)
    short_alone = passes.engine.generate("abc", max_new_tokens=4).text
    answers: dict[str, tuple] = {}
    long = threading.Thread(target=lambda: answers.update(long=_post(
        base, {"prompt": "0123", "max_tokens": 60, "stream": is_streamed})))
    started = time.monotonic()
    long.start()
    _wait_for(lambda: passes.starts)  # the long request is decoding
    answers["short"] = _post(base, {"prompt": "abc", "max_tokens": 4, "stream": is_streamed})
    long.join(timeout=30)
    assert time.monotonic() - started < 5
    status, _, body = answers["long"]
    if is_streamed:
        events = [e.removeprefix("data: ") for e in body.decode().split("\n\n") if e]
        assert status == 200 and events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "deadline_exceeded"
    else:
        assert status == 504 and json.loads(body)["error"]["code"] == "deadline_exceeded"
    assert answers["short"][0] == 200
    assert _text(answers["short"][2], is_streamed) == short_alone
    _wait_for(lambda: not service.admission.running)
    assert passes.num_rows_decoding == 0  # cancelled: it leaves at the next step
    assert max(max(starts) for starts in passes.starts) < 30  # stopped, not decoded to 55
    assert service.metrics.requests.labels(MODEL, "timeout")._value.get() == 1
    assert _post(base, {"prompt": "abc", "max_tokens": 4})[0] == 200
    assert passes.engine.scheduler.rows == [None, None]
