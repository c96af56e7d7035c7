"""The server's app in this process, called without a network: `sparsellm batch` and Ray
replicas send it requests exactly as HTTP clients would, so every route, check and response
shape is the server's own.

    server = LocalServer(config)
    await server.start()                      # loads the models (or server.load()); errors raise
    reply = await server.request("POST", "/v1/completions", {"prompt": "def f(", ...})
    async for message in server.stream(...):  # the ASGI messages, for streamed bodies
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.types import Message

from .app import create_app
from .config import ServerConfig
from .provider import ModelProvider

log = logging.getLogger("sparsellm.server")


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class LocalServer:
    def __init__(self, config: ServerConfig, provider: ModelProvider | None = None):
        self.provider = provider or ModelProvider(config)
        self.app = create_app(self.provider, config)
        self.state = self.app.state.server

    def load(self) -> None:
        """Load the models (a missing path or a bad format raises here, as the pipeline
        raises it) and start their schedulers."""
        self.state.start(self.provider.load(self.state.metrics))

    async def start(self) -> None:
        """`load` without blocking the event loop."""
        await asyncio.to_thread(self.load)

    def stop(self) -> None:
        self.state.stop()

    def metrics_text(self) -> str:
        """What /metrics would answer (Prometheus text)."""
        return self.state.metrics.render(self.state.gauges, self.state.speculation)

    async def stream(self, method: str, path: str, body: bytes = b"",
                     headers: Mapping[str, str] | None = None) -> AsyncIterator[Message]:
        """The app's ASGI messages for one request: `http.response.start`, then the body
        parts. Closing the iterator early is a client going away: the generation stops."""
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "client": ("local", 0),
            "server": ("local", 0),
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1"))
                        for k, v in (headers or {}).items()],
        }
        messages: asyncio.Queue[Message | None] = asyncio.Queue()
        gone = asyncio.Event()
        body_sent = False

        async def receive() -> Message:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            await messages.put(message)

        task = asyncio.create_task(self.app(scope, receive, send))
        task.add_done_callback(lambda _: messages.put_nowait(None))
        started = False
        try:
            while (message := await messages.get()) is not None:
                started = started or message["type"] == "http.response.start"
                yield message
        finally:
            gone.set()
            try:
                await task
            except Exception:
                if not started:
                    raise
                # the app answered (a 500 in OpenAI's shape) and re-raised for the server log
                log.exception("error in %s %s", method, path)

    async def request(self, method: str, path: str, body: Any = None,
                      headers: Mapping[str, str] | None = None) -> Reply:
        """One whole response; `body` is sent as JSON."""
        data = b"" if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json", **(headers or {})}
        status, out_headers, parts = 500, {}, []
        async for message in self.stream(method, path, data, headers):
            if message["type"] == "http.response.start":
                status = message["status"]
                out_headers = {k.decode("latin-1"): v.decode("latin-1")
                               for k, v in message.get("headers", [])}
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))
        return Reply(status, out_headers, b"".join(parts))
