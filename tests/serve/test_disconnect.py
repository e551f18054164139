"""A client that goes away mid-stream stops its decode: the engine's stream is closed and
the engine serves the next request."""

from __future__ import annotations

import http.client
import json
import time
from urllib.parse import urlsplit

from speculant.serve.app import create_app

NUM_TOKENS = 60
SECONDS_PER_PIECE = 0.02


class SlowStream:
    """The engine's stream, one piece per SECONDS_PER_PIECE; records what happened to it."""

    def __init__(self, inner, log: dict) -> None:
        self.inner, self.log = inner, log
        log.update(num_pieces=0, is_closed=False)

    def __iter__(self):
        for piece in self.inner:
            time.sleep(SECONDS_PER_PIECE)
            self.log["num_pieces"] += 1
            yield piece

    @property
    def result(self):
        return self.inner.result

    def close(self) -> None:
        self.log["is_closed"] = True
        self.inner.close()


class SlowEngine:
    """The engine, its decodes slowed down (SlowStream) and logged in ``streams``."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.streams: list[dict] = []

    def stream(self, prompt, options):
        return self._slow(self.engine.stream(prompt, options))

    def decode(self, prompt, options):
        return self._slow(self.engine.decode(prompt, options))

    def _slow(self, inner) -> SlowStream:
        self.streams.append({})
        return SlowStream(inner, self.streams[-1])

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_disconnect_closes_the_stream(serve_app, engine):
    slow = SlowEngine(engine)
    app = create_app(slow, "slow")
    where = urlsplit(serve_app(app))
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    connection.request("POST", "/v1/completions", json.dumps(
        {"model": "slow", "prompt": "hello", "max_tokens": NUM_TOKENS, "stream": True}),
        {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")  # decoding has begun
    connection.sock.close()  # the client goes away
    connection.close()
    log = slow.streams[0]
    deadline = time.monotonic() + NUM_TOKENS * SECONDS_PER_PIECE
    while not log["is_closed"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log["is_closed"] and log["num_pieces"] < NUM_TOKENS / 2
    service = app.state.service
    assert service.metrics.requests.labels("slow", "abort")._value.get() == 1
    # the engine is free again: the next request is answered in full
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    connection.request("POST", "/v1/completions", json.dumps(
        {"model": "slow", "prompt": "hello", "max_tokens": 5}),
        {"Content-Type": "application/json"})
    answer = json.loads(connection.getresponse().read())
    assert answer["usage"]["completion_tokens"] == 5
