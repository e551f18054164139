"""A decode that fails: before the answer a 500 in OpenAI's JSON, after a streamed 200 a last
error event; the server serves the next request either way."""

from __future__ import annotations

import json
import time

from speculant.errors import ContractError
from speculant.serve.app import create_app


class FailingStream:
    def __init__(self) -> None:
        self.is_closed = False
        self.result = None

    def __iter__(self):
        yield "one piece"
        raise ContractError("the graph produced NaN", path="logits")

    def close(self) -> None:
        self.is_closed = True


class FailingEngine:
    """Every decode fails: ``decode`` at once, ``stream`` after one piece (``package``: a
    real one's, for the server's token budget)."""

    def __init__(self, package) -> None:
        self.package = package
        self.streams: list[FailingStream] = []

    def decode(self, prompt, options):
        raise ContractError("the graph produced NaN", path="logits")

    def stream(self, prompt, options):
        self.streams.append(FailingStream())
        return self.streams[-1]


def _post(raw, body: dict) -> tuple[int, bytes]:
    status, _, answer = raw("POST", "/v1/completions", json.dumps(body),
                            {"Content-Type": "application/json"})
    return status, answer


def test_failures_are_reported_and_survived(serve_app, raw_at, engine):
    engine = FailingEngine(engine.package)
    app = create_app(engine, "failing")
    raw = raw_at(serve_app(app))

    request = {"model": "failing", "prompt": "hello", "max_tokens": 4}
    for _ in range(2):
        status, answer = _post(raw, request)
        assert status == 500
        error = json.loads(answer)["error"]
        assert error["type"] == "server_error" and "NaN" in error["message"]

        status, answer = _post(raw, {**request, "stream": True})
        assert status == 200
        events = [line.removeprefix("data: ") for line in answer.decode().split("\n\n") if line]
        assert json.loads(events[0])["choices"][0]["text"] == "one piece"
        assert "NaN" in json.loads(events[-2])["error"]["message"]
        assert events[-1] == "[DONE]"
        deadline = time.monotonic() + 10  # closed on the engine thread, right after the answer
        while not engine.streams[-1].is_closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.streams[-1].is_closed
    metrics = app.state.service.metrics
    assert metrics.errors.labels("failing", "500")._value.get() == 4
    assert metrics.requests.labels("failing", "abort")._value.get() == 2
