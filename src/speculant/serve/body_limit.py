"""Refuse request bodies over a size with 413, before they are read whole (ASGI middleware).

A declared ``Content-Length`` over the limit is refused at once; a chunked body is counted
as it arrives and refused once it passes the limit (an HTTPException, so that FastAPI's body
reader passes it on to the app's handler rather than calling it a parse error).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.exceptions import HTTPException


class BodyLimit:
    def __init__(self, app, *, max_bytes: int, on_refused: Callable[[], None] = lambda: None):
        self.app = app
        self.max_bytes = max_bytes
        self.on_refused = on_refused

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send)
            return
        num_received = 0

        async def counted_receive():
            nonlocal num_received
            message = await receive()
            if message["type"] == "http.request":
                num_received += len(message.get("body", b""))
                if num_received > self.max_bytes:
                    raise HTTPException(413, self._message)
            return message

        await self.app(scope, counted_receive, send)

    @property
    def _message(self) -> str:
        return f"request body over {self.max_bytes} bytes"

    async def _refuse(self, send) -> None:
        self.on_refused()
        body = json.dumps({"error": {
            "message": self._message,
            "type": "invalid_request_error", "param": None, "code": "body_too_large"}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
