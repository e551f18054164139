"""The OpenAI-compatible routes over one engine (FastAPI).

    GET  /v1/models              the one model served
    POST /v1/completions         text completion, streamed as server-sent events on request
    POST /v1/chat/completions    chat, rendered with the package's chat template
    GET  /health                 200 once the engine is loaded
    GET  /metrics                Prometheus exposition (speculant.serve.metrics)

Errors are OpenAI's JSON (``{"error": {"message", "type", "param", "code"}}``) with a 4xx
status for anything the client sent; the server keeps serving after every one of them.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from speculant import GenerationOptions
from speculant.errors import RequestError, SpeculantError
from speculant.serve.body_limit import BodyLimit
from speculant.serve.schemas import ChatRequest, CompletionRequest
from speculant.serve.service import Piece, Service

MAX_BODY_BYTES = 1 << 20  # 1 MiB


def create_app(engine: Any, model_name: str, defaults: GenerationOptions | None = None, *,
               max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The app over ``engine`` (``speculant.load``'s, or anything with its
    ``generate``/``stream``/``prepare_chat``); requests leave out fields to take
    ``defaults``."""
    app = FastAPI(title="speculant", docs_url=None, redoc_url=None)
    service = Service(engine, model_name, defaults or GenerationOptions())
    app.state.service = service

    def get_service() -> Service:
        return service

    app.add_middleware(BodyLimit, max_bytes=max_body_bytes,
                       on_refused=lambda: get_service().metrics.observe_error(413))
    _add_error_handlers(app, get_service)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": get_service().model_name, "pid": os.getpid()}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(get_service().metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict:
        name = get_service().model_name
        return {"object": "list", "data": [{"id": name, "object": "model",
                                            "created": int(time.time()),
                                            "owned_by": "speculant"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        service = _checked(get_service(), body.model)
        options = body.options(service.defaults)
        if body.stream:
            return await _streamed(service, body, "text_completion",
                                   lambda: service.engine.stream(body.prompt, options))
        result = await service.complete(lambda: service.engine.generate(body.prompt, options))
        choice = {"index": 0, "text": result.text, "logprobs": None,
                  "finish_reason": result.finish_reason}
        return _envelope("cmpl", "text_completion", service.model_name, [choice],
                         usage=_usage(result))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest):
        service = _checked(get_service(), body.model)
        options = body.options(service.defaults)
        messages = [m.as_dict() for m in body.messages]
        # rendered before the request waits for the engine: a slow template holds no one
        prompt, options = await run_in_threadpool(service.engine.prepare_chat, messages,
                                                  options)
        if body.stream:
            return await _streamed(service, body, "chat.completion.chunk",
                                   lambda: service.engine.stream(prompt, options))
        result = await service.complete(lambda: service.engine.generate(prompt, options))
        choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
                  "logprobs": None, "finish_reason": result.finish_reason}
        return _envelope("chatcmpl", "chat.completion", service.model_name, [choice],
                         usage=_usage(result))

    return app


def _checked(service: Service, model: str) -> Service:
    if model != service.model_name:
        raise HTTPException(404, f"The model {model!r} does not exist; this server serves "
                                 f"{service.model_name!r} (GET /v1/models)")
    return service


async def _streamed(service: Service, body: Any, kind: str,
                    open_stream: Callable[[], Any]) -> StreamingResponse:
    events = service.stream(open_stream)
    await events.__anext__()  # admitted: a RequestError is raised here, before 200
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    ident, created = f"{prefix}-{uuid.uuid4().hex}", int(time.time())
    include_usage = body.include_usage

    def chunk(piece: Piece | None = None, finish_reason: str | None = None) -> str:
        text = piece.text if piece is not None else ""
        if kind == "text_completion":
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        else:
            delta = {"role": "assistant", "content": ""} if piece is None else (
                {"content": text} if finish_reason is None else {})
            choice = {"index": 0, "delta": delta, "logprobs": None,
                      "finish_reason": finish_reason}
        payload = {"id": ident, "object": kind, "created": created,
                   "model": service.model_name, "choices": [choice]}
        if include_usage:
            payload["usage"] = None
        return _sse(payload)

    async def body_events() -> AsyncIterator[str]:
        try:
            if kind != "text_completion":
                yield chunk()  # the assistant's role first, as OpenAI sends it
            async for piece in events:
                if piece.result is None:
                    yield chunk(piece)
                    continue
                yield chunk(piece, piece.result.finish_reason)
                if include_usage:
                    yield _sse({"id": ident, "object": kind, "created": created,
                                "model": service.model_name, "choices": [],
                                "usage": _usage(piece.result)})
        except SpeculantError as error:  # after 200: the error travels as an event
            service.metrics.observe_error(500)
            yield _sse(_error_body(str(error), "server_error"))
        finally:
            await events.aclose()
        yield "data: [DONE]\n\n"

    return StreamingResponse(body_events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _usage(result: Any) -> dict:
    completion = len(result.token_ids)
    return {"prompt_tokens": result.num_prompt_tokens, "completion_tokens": completion,
            "total_tokens": result.num_prompt_tokens + completion}


def _envelope(prefix: str, kind: str, model: str, choices: list, *, usage: dict) -> dict:
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
            "model": model, "choices": choices, "usage": usage}


def _error_body(message: str, kind: str, param: str | None = None,
                code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _add_error_handlers(app: FastAPI, get_service: Callable[[], Service]) -> None:
    def answer(status: int, message: str, kind: str = "invalid_request_error",
               param: str | None = None, code: str | None = None) -> JSONResponse:
        get_service().metrics.observe_error(status)
        return JSONResponse(_error_body(message, kind, param, code), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        problems = error.errors()
        first = problems[0] if problems else {}
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        message = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: "
            f"{e.get('msg', '')}" for e in problems[:5])
        return answer(400, message, param=".".join(loc) or None,
                      code=first.get("type"))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        code = "model_not_found" if error.status_code == 404 and "model" in str(error.detail) \
            else None
        return answer(error.status_code, str(error.detail), code=code)

    @app.exception_handler(RequestError)
    async def refused(_: Request, error: RequestError) -> JSONResponse:
        param = error.problems[0].path if error.problems else None
        return answer(400, str(error), param=param or None)

    @app.exception_handler(SpeculantError)
    async def failed(_: Request, error: SpeculantError) -> JSONResponse:
        return answer(500, f"{type(error).__name__}: {error}", kind="server_error")

    @app.exception_handler(Exception)
    async def crashed(_: Request, error: Exception) -> JSONResponse:
        return answer(500, f"internal error: {type(error).__name__}", kind="server_error")
