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

import dataclasses
import functools
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

from speculant import GenerationOptions, Grammar
from speculant.errors import RequestError, SpeculantError
from speculant.serve.admission import DeadlineExceededError, QueueFullError
from speculant.serve.body_limit import BodyLimit
from speculant.serve.choices import (
    chat_logprobs,
    choice_options,
    completion_logprobs,
    format_grammar,
)
from speculant.serve.limits import ServerLimits
from speculant.serve.schemas import ChatRequest, CompletionRequest
from speculant.serve.service import ClientGoneError, Piece, Service
from speculant.serve.tool_calls import ToolAnswer

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
        if body.stream and body.echo and body.logprobs is not None:
            raise RequestError("echo with logprobs is answered whole, not streamed",
                               path="stream", remedy="send stream=false")
        options = _with_output(body.options(service.defaults), body, body.logprobs,
                               prompt_logprobs=body.echo and body.logprobs is not None)

        def budgeted(choice: GenerationOptions) -> GenerationOptions:
            return service.budgeted(choice, body.max_tokens, lambda: (
                len(engine.tokenizer.encode(prompt)) if isinstance(prompt, str) else len(prompt)))
        choices = choice_options(options, body.n)
        echoed = (prompt if isinstance(prompt, str) else engine.tokenizer.decode(prompt)) \
            if body.echo else ""
        if body.stream:
            return await _streamed(service, body, "text_completion", [
                lambda c=c: service.open(prompt, budgeted(c), text=True) for c in choices],
                echoed=echoed)
        results = [await service.complete(lambda c=c: service.open(prompt, budgeted(c),
                                                                   text=False),
                                          request.is_disconnected) for c in choices]

        def logprobs(result) -> dict | None:
            if body.logprobs is None:
                return None
            ids, entries = list(result.token_ids), list(result.logprobs)
            if body.echo:
                prompt_ids = engine.tokenizer.encode(prompt) if isinstance(prompt, str) \
                    else list(prompt)
                ids, entries = prompt_ids + ids, list(result.prompt_logprobs) + entries
            return completion_logprobs(engine.tokenizer, ids, entries)
        return _envelope("cmpl", "text_completion", service.model_name, [
            {"index": i, "text": echoed + result.text, "logprobs": logprobs(result),
             "finish_reason": result.finish_reason} for i, result in enumerate(results)],
            usage=_usage(results))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        service = _checked(get_service(), body.model)
        engine = service.engine
        template = getattr(engine, "chat_template", None)
        has_developer_role = template is not None and "developer" in template.source
        messages = [m.as_dict(has_developer_role=has_developer_role) for m in body.messages]
        tools, answer = body.tool_list, ToolAnswer.of(body)
        options = _with_output(body.options(service.defaults), body,
                               (body.top_logprobs or 0) if body.logprobs else None,
                               grammar=answer.grammar)
        # rendered before the request waits for the engine: a slow template holds no one
        prompt, prepared = await run_in_threadpool(functools.partial(
            engine.prepare_chat, messages, options, **({"tools": tools} if tools else {})))
        # under a grammar the end-of-turn texts could match inside a JSON string: the
        # grammar ends the answer, single-token ends are the ids it allows there
        options = prepared if options.grammar is None else dataclasses.replace(
            prepared, stop=options.stop)

        def open_chat(choice: GenerationOptions):
            return service.open(prompt, service.budgeted(
                choice, body.max_completion_tokens or body.max_tokens,
                lambda: len(engine.tokenizer.encode(prompt))), text=True)
        choices = choice_options(options, body.n)
        if body.stream:
            return await _streamed(service, body, "chat.completion.chunk", [
                lambda c=c: open_chat(c) for c in choices], answer=answer if tools else None)
        results = [await service.complete(lambda c=c: open_chat(c), request.is_disconnected)
                   for c in choices]

        def choice(i: int, result) -> dict:
            content, calls = answer.parse(result.text) if tools else (result.text, [])
            message = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [call.as_openai() for call in calls]
            return {"index": i, "message": message, "logprobs": chat_logprobs(
                engine.tokenizer, result.logprobs, body.top_logprobs or 0)
                if body.logprobs else None, "finish_reason": "tool_calls" if calls
                else result.finish_reason}
        return _envelope("chatcmpl", "chat.completion", service.model_name,
                         [choice(i, r) for i, r in enumerate(results)], usage=_usage(results))

    return app


def _with_output(options: GenerationOptions, body: Any, logprobs: int | None, *,
                 prompt_logprobs: bool = False, grammar: Grammar | None = None
                 ) -> GenerationOptions:
    """``options`` with what the answer must be (``response_format``'s grammar, or a forced
    tool call's) and the log-probabilities asked, where the request asks."""
    grammar = grammar or format_grammar(body.response_format)
    changes: dict[str, Any] = {"grammar": grammar} if grammar is not None else {}
    if logprobs is not None or prompt_logprobs:
        changes.update(logprobs=logprobs, prompt_logprobs=prompt_logprobs)
    return dataclasses.replace(options, **changes) if changes else options


def _checked(service: Service, model: str) -> Service:
    if model != service.model_name:
        raise HTTPException(404, f"The model {model!r} does not exist; this server serves "
                                 f"{service.model_name!r} (GET /v1/models)")
    return service


async def _streamed(service: Service, body: Any, kind: str, openers: list[Callable[[], Any]],
                    *, echoed: str = "", answer: ToolAnswer | None = None
                    ) -> StreamingResponse:
    """The choices' chunks, one choice after another; the first is admitted before the 200
    (a RequestError is a 4xx), the others as their turn comes (an error: a last event).
    ``answer``: tools are on, so each choice's text is held and sent at its end as content or
    tool calls."""
    events = service.stream(openers[0])
    await events.__anext__()  # admitted: a RequestError is raised here, before 200
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    ident, created = f"{prefix}-{uuid.uuid4().hex}", int(time.time())
    include_usage = body.include_usage
    tokenizer = getattr(service.engine, "tokenizer", None)

    def chunk(index: int, delta: dict | None = None, finish_reason: str | None = None,
              logprobs: list | None = None) -> str:
        if kind == "text_completion":
            shaped = completion_logprobs(tokenizer, [e.token for e in logprobs], logprobs) \
                if logprobs is not None else None
            choice = {"index": index, "text": (delta or {}).get("content", ""),
                      "logprobs": shaped, "finish_reason": finish_reason}
        else:
            shaped = chat_logprobs(tokenizer, logprobs, body.top_logprobs or 0) \
                if logprobs is not None else None
            choice = {"index": index, "delta": delta or {}, "logprobs": shaped,
                      "finish_reason": finish_reason}
        payload = {"id": ident, "object": kind, "created": created,
                   "model": service.model_name, "choices": [choice]}
        if include_usage:
            payload["usage"] = None
        return _sse(payload)

    def wanted(piece: Piece) -> list | None:
        return piece.logprobs if body.logprobs is not None and body.logprobs is not False \
            else None

    async def body_events() -> AsyncIterator[str]:
        nonlocal events
        results = []
        try:
            for index, opener in enumerate(openers):
                if index:
                    events = service.stream(opener)
                    await events.__anext__()
                if kind != "text_completion":  # the assistant's role first, as OpenAI sends
                    yield chunk(index, {"role": "assistant", "content": ""})
                elif echoed:
                    yield chunk(index, {"content": echoed})
                held = []
                async for piece in events:
                    if piece.result is None:
                        if answer is None:
                            yield chunk(index, {"content": piece.text},
                                        logprobs=wanted(piece))
                        else:
                            held.append(piece)
                        continue
                    results.append(piece.result)
                    if answer is not None:
                        for event in _tool_answer(chunk, index, answer, piece.result, held):
                            yield event
                        continue
                    yield chunk(index, {"content": piece.text} if piece.text else {},
                                piece.result.finish_reason, logprobs=wanted(piece))
                await events.aclose()
            if include_usage:
                yield _sse({"id": ident, "object": kind, "created": created,
                            "model": service.model_name, "choices": [],
                            "usage": _usage(results)})
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


def _tool_answer(chunk: Callable[..., str], index: int, answer: ToolAnswer, result: Any,
                 held: list[Piece]) -> list[str]:
    """The held text of a choice with tools, sent whole: as tool calls where it makes
    them, else as content; then its finish."""
    content, calls = answer.parse(result.text)
    entries = [e for piece in held for e in piece.logprobs] or None
    events = [chunk(index, {"content": content}, logprobs=entries)] if content else []
    if calls:
        events.append(chunk(index, {"tool_calls": [
            {"index": j, **call.as_openai()} for j, call in enumerate(calls)]}))
    events.append(chunk(index, None, "tool_calls" if calls else result.finish_reason))
    return events


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _usage(results: list) -> dict:
    """Usage of a request's choices: the prompt once, every choice's tokens."""
    prompt = results[0].num_prompt_tokens if results else 0
    completion = sum(len(result.token_ids) for result in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


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
