"""ASGI middleware on the server's headers: the API key, and ``X-Request-Id`` on every response
(the client's, or a fresh one), so a client and the server's logs name a request alike."""

from __future__ import annotations

import uuid

from starlette.responses import JSONResponse

from .protocol import ApiError

OPEN_PATHS = ("/health", "/metrics")
MAX_REQUEST_ID = 200  # characters of a client's X-Request-Id kept


class ApiKey:
    """401 unless ``Authorization: Bearer KEY`` (``/health`` and ``/metrics`` are open)."""

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


class RequestId:
    """Every HTTP response carries ``X-Request-Id``: the request's own (printable, at most
    :data:`MAX_REQUEST_ID` characters), else a fresh uuid4."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"")[:MAX_REQUEST_ID]
        rid = given if given and given.isascii() and given.decode().isprintable() else uuid.uuid4().hex.encode()

        async def with_id(message):
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message = {**message, "headers": headers + [(b"x-request-id", rid)]}
            await send(message)

        await self.app(scope, receive, with_id)
