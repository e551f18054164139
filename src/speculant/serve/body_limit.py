"""Refuse request bodies over a size (413) or slower than a deadline (408), before they are
read whole (ASGI middleware).

A declared ``Content-Length`` over the limit is refused at once; a chunked body is counted
as it arrives and refused once it passes the limit. The whole body must arrive within
``timeout_s`` of the request head; a client that sends part of it and stalls is answered 408
and its connection closed. Both are raised as HTTPExceptions from ``receive``, so that
FastAPI's body reader passes them on to the app's handler rather than calling them a parse
error. Once the body is in, ``receive`` is the server's own (disconnect watching).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from starlette.exceptions import HTTPException


class BodyLimit:
    def __init__(self, app, *, max_bytes: int, timeout_s: float,
                 on_refused: Callable[[], None] = lambda: None):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.on_refused = on_refused

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send)
            return
        num_received, is_complete = 0, False
        deadline = asyncio.get_running_loop().time() + self.timeout_s

        async def guarded_receive():
            nonlocal num_received, is_complete
            if is_complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(408, f"the request body did not arrive within "
                                         f"{self.timeout_s:g} s", {"connection": "close"}
                                    ) from None
            if message["type"] == "http.request":
                num_received += len(message.get("body", b""))
                if num_received > self.max_bytes:
                    raise HTTPException(413, self._message)
                is_complete = not message.get("more_body", False)
            return message

        await self.app(scope, guarded_receive, send)

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
