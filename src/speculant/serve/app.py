"""The OpenAI-compatible routes over one engine (FastAPI).

    GET  /v1/models              the one model served
    POST /v1/completions         text completion, streamed as server-sent events on request
    POST /v1/chat/completions    chat, rendered with the package's chat template
    GET  /health                 200 while the engine makes progress; 503 with the reason if not
    GET  /metrics                Prometheus exposition (speculant.serve.metrics)

Errors are OpenAI's JSON (``{"error": {"message", "type", "param", "code"}}``) with a 4xx
status for anything the client sent, 429 (with ``Retry-After``) when the queue is full and
504 when a request passes its deadline; the server keeps serving after every one of them.
The limits are :class:`speculant.serve.limits.ServerLimits`.
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
from speculant.serve.admission import DeadlineExceededError, QueueFullError
from speculant.serve.body_limit import BodyLimit
from speculant.serve.limits import ServerLimits
from speculant.serve.schemas import ChatRequest, CompletionRequest
from speculant.serve.service import ClientGoneError, Piece, Service

MAX_BODY_BYTES = ServerLimits.max_body_bytes


def create_app(engine: Any, model_name: str, defaults: GenerationOptions | None = None, *,
               limits: ServerLimits | None = None) -> FastAPI:
    """The app over ``engine`` (``speculant.load``'s, or anything with its
    ``stream``/``decode``/``prepare_chat`` and ``package``); requests leave out fields to
    take ``defaults``; ``limits``: the server's (:class:`ServerLimits`' defaults)."""
    limits = limits or ServerLimits()
    app = FastAPI(title="speculant", docs_url=None, redoc_url=None)
    service = Service(engine, model_name, defaults or GenerationOptions(), limits)
    app.state.service = service

    def get_service() -> Service:
        return service

    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes,
                       timeout_s=limits.body_timeout_s,
                       on_refused=lambda: get_service().metrics.observe_error(413))
    _add_error_handlers(app, get_service)

    @app.get("/health")
    async def health() -> JSONResponse:
        service = get_service()
        stalled = service.admission.stalled(service.limits.stall_grace_s)
        answer = {"status": "stalled" if stalled else "ok", "model": service.model_name,
                  "pid": os.getpid(), "num_running": len(service.admission.running),
                  "num_waiting": service.admission.num_waiting}
        if stalled:
            answer["reason"] = stalled
        return JSONResponse(answer, status_code=503 if stalled else 200)

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
    async def completions(body: CompletionRequest, request: Request):
        service = _checked(get_service(), body.model)
        engine, prompt = service.engine, body.prompt

        def budgeted() -> GenerationOptions:
            return service.budgeted(body.options(service.defaults), body.max_tokens, lambda: (
                len(engine.tokenizer.encode(prompt)) if isinstance(prompt, str) else len(prompt)))
        if body.stream:
            return await _streamed(service, body, "text_completion",
                                   lambda: engine.stream(prompt, budgeted()))
        result = await service.complete(lambda: engine.decode(prompt, budgeted()),
                                        request.is_disconnected)
        choice = {"index": 0, "text": result.text, "logprobs": None,
                  "finish_reason": result.finish_reason}
        return _envelope("cmpl", "text_completion", service.model_name, [choice],
                         usage=_usage(result))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        service = _checked(get_service(), body.model)
        engine = service.engine
        template = getattr(engine, "chat_template", None)
        has_developer_role = template is not None and "developer" in template.source
        messages = [m.as_dict(has_developer_role=has_developer_role) for m in body.messages]
        # rendered before the request waits for the engine: a slow template holds no one
        prompt, options = await run_in_threadpool(engine.prepare_chat, messages,
                                                  body.options(service.defaults))

        def open_chat():
            return engine.stream(prompt, service.budgeted(
                options, body.max_completion_tokens or body.max_tokens,
                lambda: len(engine.tokenizer.encode(prompt))))
        if body.stream:
            return await _streamed(service, body, "chat.completion.chunk", open_chat)
        result = await service.complete(open_chat, request.is_disconnected)
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
            status = getattr(error, "status", 500)
            service.metrics.observe_error(status)
            yield _sse(_error_body(str(error), "server_error", code=getattr(error, "code",
                                                                            None)))
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
        response = answer(error.status_code, str(error.detail), code=code)
        response.headers.update(error.headers or {})
        return response

    @app.exception_handler(QueueFullError)
    async def busy(_: Request, error: QueueFullError) -> JSONResponse:
        response = answer(error.status, str(error), kind="server_error", code=error.code)
        response.headers["Retry-After"] = str(error.retry_after_s)
        return response

    @app.exception_handler(DeadlineExceededError)
    async def late(_: Request, error: DeadlineExceededError) -> JSONResponse:
        return answer(error.status, str(error), kind="server_error", code=error.code)

    @app.exception_handler(ClientGoneError)
    async def gone(_: Request, error: ClientGoneError) -> Response:
        return Response(status_code=499)  # nobody reads it; counted as an abort

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
