"""One ASGI middleware in front of every route: draining (503), API key (401), content type
(415), body size (413), in-flight counting and request metrics.

The body is read here, counting bytes as they arrive, so an oversized request is refused before
it is fully read (at once when its Content-Length says so, for chunked bodies as soon as the
count passes the limit); the app then gets the body replayed.
"""

from __future__ import annotations

import hmac
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_bytes
from .state import ServerState

AUTH_EXEMPT = {"/health", "/", "/playground", "/favicon.ico"}
BODY_METHODS = {"POST", "PUT", "PATCH"}


class GuardMiddleware:
    def __init__(self, app: ASGIApp, state: ServerState, known_routes: set[str],
                 json_routes: set[str]):
        self.app = app
        self.state = state
        # both filled in after the routes are registered
        self.known_routes = known_routes
        self.json_routes = json_routes  # routes whose POST body is JSON
        key = state.config.api_key
        self.api_key = key.encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        status = 0

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._guard(scope, receive, send_status)
        finally:
            route = path if path in self.known_routes else "other"
            self.state.metrics.count_request(scope["method"], route, status or 500)

    async def _guard(self, scope: Scope, upstream: Receive, send: Send) -> None:
        headers = {k.lower(): v for k, v in scope["headers"]}
        if self.state.draining:
            await _reply(send, 503, "the server is shutting down; retry on another instance",
                         [(b"retry-after", b"5"), (b"connection", b"close")])
            return
        if self.api_key is not None and scope["path"] not in AUTH_EXEMPT:
            auth = headers.get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(),
                                                                      self.api_key):
                await _reply(send, 401, "invalid or missing API key: send 'Authorization: "
                             "Bearer <key>'", [(b"www-authenticate", b"Bearer")],
                             code="invalid_api_key")
                return
        if scope["method"] in BODY_METHODS:
            content_type = headers.get(b"content-type")
            if scope["path"] in self.json_routes:
                if content_type is None:  # read as JSON, as the only type accepted
                    scope = {**scope, "headers": [*scope["headers"],
                                                  (b"content-type", b"application/json")]}
                elif not is_json(content_type):
                    shown = content_type.decode("latin-1")[:100]
                    await _reply(send, 415, f"unsupported Content-Type {shown!r}: send the body "
                                 "as JSON with the header 'Content-Type: application/json'",
                                 code="unsupported_media_type")
                    return
            body = await self._read_body(headers, upstream, send)
            if body is None:
                return
            replayed = False

            async def receive_body() -> Message:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await upstream()  # after the body: wait for http.disconnect

            receive = receive_body
        else:
            receive = upstream
        self.state.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.inflight -= 1

    async def _read_body(self, headers: dict[bytes, bytes], receive: Receive,
                         send: Send) -> bytes | None:
        limit = self.state.config.max_request_bytes
        too_large = f"the request body is larger than the limit of {limit} bytes"
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await _reply(send, 400, "invalid Content-Length header")
                return None
            if int(declared) > limit:
                await _reply(send, 413, too_large, code="request_too_large")
                return None
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > limit:
                await _reply(send, 413, too_large, code="request_too_large")
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def is_json(content_type: bytes) -> bool:
    """application/json or application/*+json, with any parameters (charset=utf-8)."""
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/")
                                             and media.endswith(b"+json"))


async def _reply(send: Send, status: int, message: str,
                 extra_headers: list[tuple[bytes, bytes]] | None = None,
                 code: str | None = None) -> None:
    body = error_bytes(status, message, code)
    headers: list[Any] = [(b"content-type", b"application/json"),
                          (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status,
                "headers": headers + (extra_headers or [])})
    await send({"type": "http.response.body", "body": body, "more_body": False})
