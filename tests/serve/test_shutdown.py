"""SIGTERM stops `speculant serve` within its --shutdown-timeout, even while a client holds a
half-sent request and a long decode is streaming (a subprocess, real sockets)."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time

SHUTDOWN_TIMEOUT_S = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(port: int, server: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.poll() is None, "the server exited while starting"
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)


def test_sigterm_with_a_half_sent_request_and_a_decode_in_flight_exits_in_time():
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "speculant", "serve", "demo", "--port", str(port),
         "--log-level", "warning", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S),
         "--body-timeout", "60", "--header-timeout", "60"])  # only the shutdown bound acts
    try:
        _wait_healthy(port, server)
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                     b"Content-Type: application/json\r\n\r\n{")
        streaming = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        streaming.request("POST", "/v1/completions", json.dumps(
            {"model": "demo", "prompt": "def f(x):", "stream": True}),  # the whole context
            {"Content-Type": "application/json"})
        response = streaming.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: ")
        signalled = time.monotonic()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=SHUTDOWN_TIMEOUT_S + 8)
        assert time.monotonic() - signalled < SHUTDOWN_TIMEOUT_S + 8
        half.close()
        streaming.close()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
