"""The HTTP endpoints (Starlette), each answering as the API it imitates.

OpenAI: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream``:
server-sent events, one chunk per generated token, the last carrying ``finish_reason``, then
``data: [DONE]``; ``stream_options.include_usage`` adds a last chunk with the usage). SGLang:
``POST /generate`` (streamed chunks carry the cumulative ``text`` and ``meta_info``),
``GET /model_info`` and ``GET /server_info`` (also under their older ``/get_...`` names),
``POST /flush_cache`` (nothing is cached across requests: a no-op). ``GET /health`` (200 once the
model is loaded; 503 with the reason while loading, draining or failed) and ``GET /metrics``
(Prometheus). With an API key every endpoint but ``/health`` and ``/metrics`` wants
``Authorization: Bearer KEY`` (401 otherwise), as SGLang's server does.

A client that disconnects mid-request (streaming or not) has its request aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from . import protocol, render
from .frontend import Frontend, Handle
from .metrics import CONTENT_TYPE
from .protocol import ApiError

OPEN_PATHS = ("/health", "/metrics")


def build_app(frontend: Frontend, api_key: str | None = None) -> Starlette:
    """The ASGI app serving ``frontend``."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        frontend.attach_loop(asyncio.get_running_loop())
        yield

    async def generation(request: Request, parse, renderer) -> Response:
        body = await _json_body(request)
        frontend.check_open()
        call = parse(body, frontend.served)
        handle = frontend.submit(call)
        if call.stream:
            return StreamingResponse(_sse(frontend, handle, renderer), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _whole(frontend, handle, renderer, request)

    async def completions(request):
        return await generation(request, protocol.completion, render.completion)

    async def chat(request):
        return await generation(request, protocol.chat, render.chat)

    async def generate(request):
        return await generation(request, protocol.generate, render.generate)

    async def models(request):
        return JSONResponse({"object": "list", "data": [render.model_card(frontend)]})

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
              Route("/v1/models", models), Route("/health", health), Route("/metrics", metrics),
              Route("/model_info", model_info), Route("/get_model_info", model_info),
              Route("/server_info", server_info), Route("/get_server_info", server_info),
              Route("/flush_cache", flush_cache, methods=["POST", "GET"])]
    handlers = {ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    return _ApiKey(app, api_key) if api_key else app


async def _json_body(request: Request) -> dict:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"body: malformed JSON ({exc})", "body") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"body: expected a JSON object (got {type(body).__name__})", "body")
    return body


async def _sse(frontend: Frontend, handle: Handle, renderer):
    """Server-sent events of one request; a client that goes away aborts it."""
    try:
        first = True
        while True:
            event = await handle.events.get()
            if event[0] == "error":
                yield _data(event[1].body())
                break
            yield _data(renderer.chunk(handle, event, first))
            first = False
            if event[3] is not None:
                if handle.call.include_usage:
                    yield _data(renderer.usage_chunk(handle))
                break
        yield b"data: [DONE]\n\n"
    finally:
        frontend.abort(handle)  # a no-op once it ended


async def _whole(frontend: Frontend, handle: Handle, renderer, request: Request) -> Response:
    """The whole response once the request ended; a client that goes away first aborts it."""
    ended = asyncio.ensure_future(_last_event(handle))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({ended, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not ended.done():
        ended.cancel()
        frontend.abort(handle)
        return Response(status_code=499)  # nobody is listening
    event = ended.result()
    if event[0] == "error":
        raise event[1]
    return JSONResponse(renderer.whole(handle))


async def _last_event(handle: Handle):
    while True:
        event = await handle.events.get()
        if event[0] == "error" or event[3] is not None:
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
    error = ApiError(500, f"internal error: {type(exc).__name__}: {exc}", kind="internal_error")
    return JSONResponse(error.body(), status_code=500)


class _ApiKey:
    """ASGI middleware: 401 unless ``Authorization: Bearer KEY`` (``/health`` and ``/metrics`` are open)."""

    def __init__(self, app, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not scope["path"].startswith(OPEN_PATHS):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if given != self.expected:
                error = ApiError(401, "missing or wrong API key: send Authorization: Bearer <key>",
                                 "Authorization", kind="authentication_error", code="invalid_api_key")
                await JSONResponse(error.body(), status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
