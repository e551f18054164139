"""The server's limits, in one home: what one request may cost, how long a client may take to
send one, and how many may wait or connect. `speculant serve` offers each field as an option
(flag, default and help from here); :func:`uvicorn_config` hands them to uvicorn, with a
connection protocol for the two that uvicorn lacks (a deadline for a request's headers, and
refusing connections beyond a count; its ``limit_concurrency`` answers 503 per request but
leaves idle connections open). A request body's deadline is the ASGI layer's
(:mod:`speculant.serve.body_limit`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

UNDECLARED_CONTEXT_TOKENS = 4096  # max_tokens' cap where a package declares no context length


def _limit(default: object, flag: str, help_text: str) -> Any:
    return field(default=default, metadata={"flag": flag, "help": help_text})


@dataclass(frozen=True)
class ServerLimits:
    request_timeout_s: float = _limit(300.0, "--request-timeout", "Seconds a request may take "
                                      "from arrival, waiting included; past it the decode stops "
                                      "between steps: 504 (a stream: a last error event).")
    max_batch: int = _limit(1, "--max-batch", "Requests decoded together, one batched target "
                            "pass per step (a package with a batched target graph, up to its "
                            "rows); 1: one request at a time.")
    max_waiting: int = _limit(32, "--max-waiting", "Requests that may wait for the engine; "
                              "one more is answered 429 with Retry-After.")
    retry_after_s: int = _limit(2, "--retry-after", "Retry-After of a 429 or a refused "
                                "connection (seconds).")
    max_tokens: int | None = _limit(None, "--max-tokens", "Most tokens a request may generate, "
                                    "and what one that leaves max_tokens out gets (default: the "
                                    "remaining context).")
    header_timeout_s: float = _limit(10.0, "--header-timeout", "Seconds a connection has to "
                                     "send a request's headers, else it is closed.")
    body_timeout_s: float = _limit(30.0, "--body-timeout", "Seconds a request has to send its "
                                   "body once its headers are in, else 408.")
    keep_alive_s: float = _limit(5.0, "--keep-alive-timeout", "Seconds an idle keep-alive "
                                 "connection stays open (uvicorn's timeout_keep_alive).")
    max_connections: int = _limit(256, "--max-connections", "Open connections at most; one "
                                  "more is answered 503 and closed.")
    max_header_bytes: int = _limit(16384, "--max-header-bytes", "Largest request head "
                                   "(uvicorn's h11_max_incomplete_event_size); over it: 400.")
    max_body_bytes: int = _limit(1 << 20, "--max-body-bytes", "Largest request body accepted; "
                                 "over it: 413.")
    shutdown_timeout_s: float = _limit(10.0, "--shutdown-timeout", "Seconds SIGTERM waits for "
                                       "requests in flight before cancelling them and exiting "
                                       "(uvicorn's timeout_graceful_shutdown).")
    stall_grace_s: float = _limit(30.0, "--stall-grace", "/health answers 503 once a request "
                                  "is this many seconds past its deadline without ending its "
                                  "step (a stuck engine).")


def uvicorn_config(app: Any, limits: ServerLimits, *, host: str, port: int,
                   log_level: str = "info") -> Any:
    """uvicorn's Config for ``app`` under ``limits``."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level=log_level,
                          http=guarded_protocol(limits), timeout_keep_alive=limits.keep_alive_s,
                          h11_max_incomplete_event_size=limits.max_header_bytes,
                          timeout_graceful_shutdown=limits.shutdown_timeout_s)


def guarded_protocol(limits: ServerLimits) -> type:
    """uvicorn's h11 protocol, closing a connection that has not sent a whole request head
    within ``header_timeout_s`` of connecting (or of its last response), and answering 503 to
    a connection beyond ``max_connections``."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    refusal = (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
               f"retry-after: {limits.retry_after_s}\r\nconnection: close\r\n"
               "content-length: {}\r\n\r\n{}")
    body = ('{"error": {"message": "too many connections", "type": "server_error", '
            '"param": null, "code": "too_many_connections"}}')

    class GuardedH11Protocol(H11Protocol):
        header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                transport.write(refusal.format(len(body), body).encode())
                transport.close()
                return
            self._await_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
            super().connection_lost(exc)

        def _await_head(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
            self.header_timer = self.loop.call_later(limits.header_timeout_s, self._head_late,
                                                     self.cycle)

        def _head_late(self, cycle_then: Any) -> None:
            """No request began since the timer was armed, and none is being answered."""
            is_idle = self.cycle is cycle_then and (cycle_then is None
                                                    or cycle_then.response_complete)
            if is_idle and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol
