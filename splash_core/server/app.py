"""The HTTP endpoints (Starlette), each answering as the API it imitates.

OpenAI: ``GET /v1/models`` and ``/v1/models/{id}``, ``POST /v1/completions``, ``POST
/v1/chat/completions`` (``stream``: server-sent events, one chunk per generated token and choice,
the last of each choice carrying ``finish_reason``, then ``data: [DONE]``;
``stream_options.include_usage`` adds a last chunk with the usage). SGLang: ``POST /generate``
(streamed chunks carry the cumulative ``text`` and ``meta_info``), ``GET /model_info`` and ``GET
/server_info`` (also under their older ``/get_...`` names), ``POST /flush_cache`` (nothing is
cached across requests: a no-op). vLLM: ``POST /tokenize`` and ``/detokenize``. ``GET /health``
(200 once the model is loaded; 503 with the reason while loading, draining or failed) and ``GET
/metrics`` (Prometheus). With an API key every endpoint but ``/health`` and ``/metrics`` wants
``Authorization: Bearer KEY`` (401 otherwise), as SGLang's server does.

Every response carries ``X-Request-Id`` (the client's, or a fresh one); CORS is off unless
origins are given. A body over ``max_body_bytes`` gets 413 before it is read whole; reading a
body (JSON, tokenizing, the chat template) runs off the event loop, so one huge prompt delays no
other client. A client that disconnects mid-request (streaming or not) has its request aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from pydantic_core import from_json
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from . import protocol, render, tokenize
from .frontend import Frontend
from .headers import ApiKey, RequestId
from .metrics import CONTENT_TYPE
from .protocol import ApiError
from .render import Reply

MAX_BODY_BYTES = 32 * 2**20


def build_app(frontend: Frontend, api_key: str | None = None, *, max_body_bytes: int = MAX_BODY_BYTES,
              max_prompt_tokens: int | None = None, allowed_origins: tuple[str, ...] = ()):
    """The ASGI app serving ``frontend``: bodies past ``max_body_bytes`` get 413, prompts past
    ``max_prompt_tokens`` 400; ``allowed_origins`` turns CORS on ("*": any origin)."""
    served = frontend.served

    @contextlib.asynccontextmanager
    async def lifespan(app):
        frontend.attach_loop(asyncio.get_running_loop())
        yield

    async def read(request: Request, parse, *args):
        """``parse(body, served, *args)`` of the request's JSON body, off the event loop."""
        raw = await _body(request, max_body_bytes)
        return await run_in_threadpool(lambda: parse(_json(raw), served, *args))

    async def generation(request: Request, parse, renderer) -> Response:
        frontend.check_open()
        calls = await read(request, parse, max_prompt_tokens)
        frontend.check_open()
        reply = Reply(renderer.prefix, [frontend.submit(c) for c in calls], n=calls[0].choices,
                      tokenizer=served.tokenizer)
        if calls[0].stream:
            return StreamingResponse(_sse(frontend, reply, renderer), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _whole(frontend, reply, renderer, request)

    async def completions(request):
        return await generation(request, protocol.completion, render.completion)

    async def chat(request):
        return await generation(request, protocol.chat, render.chat)

    async def generate(request):
        return await generation(request, protocol.generate, render.generate)

    async def tokenize_(request):
        return JSONResponse(await read(request, tokenize.tokenize))

    async def detokenize(request):
        return JSONResponse(await read(request, tokenize.detokenize))

    async def models(request):
        return JSONResponse({"object": "list", "data": [render.model_card(frontend)]})

    async def model(request):
        name = request.path_params["model"]
        if name != served.model:
            raise ApiError(404, f"model: {name!r} is not served here (serving {served.model!r})", "model",
                           kind="not_found_error", code="model_not_found")
        return JSONResponse(render.model_card(frontend))

    async def health(request):
        frontend.check_open()
        return Response(status_code=200)

    async def model_info(request):
        return JSONResponse(render.model_info(frontend))

    async def server_info(request):
        return JSONResponse(render.server_info(frontend))

    async def metrics(request):
        return Response(frontend.metrics.render(), media_type=CONTENT_TYPE)

    async def flush_cache(request):
        return PlainTextResponse("Cache flushed (SPLASH keeps no cache across requests).")

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/generate", generate, methods=["POST"]),
              Route("/tokenize", tokenize_, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"]),
              Route("/v1/models", models), Route("/v1/models/{model:path}", model),
              Route("/health", health), Route("/metrics", metrics),
              Route("/model_info", model_info), Route("/get_model_info", model_info),
              Route("/server_info", server_info), Route("/get_server_info", server_info),
              Route("/flush_cache", flush_cache, methods=["POST", "GET"])]
    handlers = {ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    outer = ApiKey(app, api_key) if api_key else app
    if allowed_origins:  # outside the key check: a browser's preflight carries no key
        outer = CORSMiddleware(outer, allow_origins=list(allowed_origins), allow_methods=["GET", "POST"],
                               allow_headers=["*"], expose_headers=["X-Request-Id"])
    return RequestId(outer)


async def _body(request: Request, limit: int) -> bytes:
    """The body, or 413 once it is past ``limit`` bytes (by its Content-Length, or as it streams)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"body: larger than this server's limit of {limit:,} bytes (--max-body-bytes)", "body",
                    code="body_too_large")


def _json(raw: bytes) -> dict:
    """A JSON object; NaN, Infinity, lone surrogates and nesting deeper than 200 levels are errors."""
    try:
        body = from_json(raw, allow_inf_nan=False)
    except ValueError as exc:
        raise ApiError(400, f"body: malformed JSON ({exc})", "body") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"body: expected a JSON object (got {type(body).__name__})", "body")
    return body


async def _events(handles):
    """(handle, event) of every handle's events as they come, until each one ended."""
    merged: asyncio.Queue = asyncio.Queue()

    async def pump(handle):
        while True:
            event = await handle.events.get()
            merged.put_nowait((handle, event))
            if _last(event):
                return

    pumps = [asyncio.ensure_future(pump(h)) for h in handles]
    try:
        for _ in range(len(handles)):
            while True:
                handle, event = await merged.get()
                yield handle, event
                if _last(event):
                    break
    finally:
        for p in pumps:
            p.cancel()


def _last(event) -> bool:
    return event[0] == "error" or event[3] is not None


async def _sse(frontend: Frontend, reply: Reply, renderer):
    """Server-sent events of one response; a client that goes away aborts its requests."""
    events = _events(reply.handles)
    try:
        sent, failed = {}, False  # handle id -> (its tokens so far, characters of its text so far)
        async for handle, event in events:
            if event[0] == "error":
                yield _data(event[1].body())
                failed = True
                break
            at = sent.get(handle.id, (0, 0))
            yield _data(renderer.chunk(reply, handle, event, handle.id not in sent, at))
            sent[handle.id] = (at[0] + (event[2] is not None), at[1] + len(event[1]))
        if not failed and reply.handles[0].call.include_usage:
            yield _data(renderer.usage_chunk(reply))
        yield b"data: [DONE]\n\n"
    finally:
        await events.aclose()  # stops its pumps
        for handle in reply.handles:
            frontend.abort(handle)  # a no-op once it ended


async def _whole(frontend: Frontend, reply: Reply, renderer, request: Request) -> Response:
    """The whole response once every choice ended; a client that goes away first aborts them."""
    ended = asyncio.ensure_future(asyncio.gather(*(_last_event(h) for h in reply.handles)))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({ended, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not ended.done():
            ended.cancel()
        for handle in reply.handles:
            frontend.abort(handle)  # a no-op once it ended
    if not ended.done() or ended.cancelled():
        return Response(status_code=499)  # nobody is listening
    for event in ended.result():
        if event[0] == "error":
            raise event[1]
    return JSONResponse(renderer.whole(reply))


async def _last_event(handle):
    while True:
        event = await handle.events.get()
        if _last(event):
            return event


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _data(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _api_error(request, exc: ApiError):
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request, exc: HTTPException):
    kind = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return JSONResponse(ApiError(exc.status_code, message, kind=kind).body(), status_code=exc.status_code)


async def _internal_error(request, exc: Exception):
    first = (str(exc).strip().splitlines() or [""])[0]  # one line: the cause, never a traceback
    error = ApiError(500, f"internal error: {type(exc).__name__}: {first}", kind="internal_error")
    return JSONResponse(error.body(), status_code=500)
