"""The app factory: `create_app(provider, config)` wires routes, errors, middleware and the
background model load; `serve(config)` runs it under uvicorn with a graceful SIGTERM drain."""

from __future__ import annotations

import logging
import signal
import threading
import time
from contextlib import asynccontextmanager
from importlib import resources
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from .. import __version__
from .config import ServerConfig
from .errors import install_error_handlers
from .middleware import GuardMiddleware
from .provider import ModelProvider
from .routes_openai import add_openai_routes
from .routes_predict import add_predict_routes
from .schemas import ErrorResponse, Health
from .state import ServerState

log = logging.getLogger("sparsellm.server")

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text} for status, text in [
        (400, "invalid request"), (401, "missing or wrong API key"),
        (404, "unknown model"), (413, "request body too large"),
        (415, "the body is not sent as application/json"),
        (429, "at capacity; see Retry-After"), (503, "loading or shutting down"),
    ]
}


def create_app(provider: ModelProvider, config: ServerConfig | None = None) -> FastAPI:
    """The FastAPI app serving `provider`'s models (loaded in a background thread at startup)."""
    config = config or provider.config
    state = ServerState(config=config, endpoints=provider.endpoints)

    def load() -> None:
        try:
            served = provider.load(state.metrics)
        except Exception as e:  # noqa: BLE001 -- reported through /health and the log
            log.exception("loading the model(s) failed")
            state.load_error = f"{type(e).__name__}: {e}"
            return
        state.start(served)

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        threading.Thread(target=load, name="model-load", daemon=True).start()
        yield
        state.stop()

    app = FastAPI(title="sparsellm", version=__version__, lifespan=lifespan,
                  description="Text generation on CPUs: DeepSparse-style /predict and an "
                              "OpenAI-compatible /v1 API.")
    app.state.server = state
    install_error_handlers(app)

    @app.get("/health", response_model=Health, responses={503: {"model": Health}},
             tags=["server"])
    async def health() -> JSONResponse:
        """200 once the models are loaded; 503 while loading (or if loading failed)."""
        if state.ready:
            return JSONResponse({"status": "ok", "detail": None})
        if state.load_error:
            return JSONResponse({"status": "failed", "detail": "model load failed; see the log"},
                                status_code=503)
        return JSONResponse({"status": "loading", "detail": None}, status_code=503)

    @app.get("/metrics", response_class=PlainTextResponse, tags=["server"],
             responses={401: ERROR_RESPONSES[401]})
    async def metrics() -> PlainTextResponse:
        """Prometheus text format."""
        return PlainTextResponse(state.metrics.render(state.gauges, state.speculation),
                                 media_type="text/plain; version=0.0.4")

    if config.local_routes:
        add_predict_routes(app, state, ERROR_RESPONSES)
    if config.openai_routes:
        add_openai_routes(app, state, ERROR_RESPONSES)
        page = resources.files("sparsellm.server").joinpath("static/index.html").read_text()

        @app.get("/", response_class=HTMLResponse, include_in_schema=False)
        @app.get("/playground", response_class=HTMLResponse, include_in_schema=False)
        async def playground() -> HTMLResponse:
            return HTMLResponse(page)

    def openapi() -> dict[str, Any]:
        """FastAPI's schema without its 422 responses: validation errors here are 400s."""
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            for path in schema.get("paths", {}).values():
                for op in path.values():
                    op.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    known: set[str] = set()
    json_routes: set[str] = set()
    app.add_middleware(GuardMiddleware, state=state, known_routes=known, json_routes=json_routes)
    known.update(getattr(r, "path", "") for r in app.routes)
    json_routes.update(r.path for r in app.routes if "POST" in (getattr(r, "methods", None)
                                                                 or ()))
    return app


class DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT: refuse new requests (503), let in-flight ones finish (bounded by
    `drain_timeout`), then exit with status 0. A second signal exits at once."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout: float):
        super().__init__(config)
        self.state = state
        self.drain_timeout = drain_timeout

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not calling super(): it records the signal and re-raises it at exit (status 128+sig).
        if self.state.draining:
            self.should_exit = self.force_exit = True
            return
        self.state.draining = True
        log.info("signal %s: draining %d in-flight request(s)", signal.Signals(sig).name,
                 self.state.inflight)
        threading.Thread(target=self._drain, name="drain", daemon=True).start()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout
        while self.state.inflight > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.state.inflight:
            log.warning("drain timeout: %d request(s) still running", self.state.inflight)
        self.should_exit = True


def serve(config: ServerConfig, provider: ModelProvider | None = None) -> int:
    """Run the server until SIGTERM/SIGINT; returns the exit status."""
    provider = provider or ModelProvider(config)
    app = create_app(provider, config)
    uv_config = uvicorn.Config(app, host=config.host, port=config.port,
                               log_level=config.log_level, timeout_graceful_shutdown=5,
                               access_log=config.log_level in ("debug", "trace"))
    server = DrainingServer(uv_config, app.state.server, config.drain_timeout)
    server.run()
    return 0
