"""Server state and the glue between routes and schedulers: pick a model, build the generation
config, submit, then collect results or stream events (cancelling when the client goes away)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..engine import ContextLengthError
from ..generation import GenerationConfig, GenerationRequest
from ..generation.speculative import SpeculationStats
from .config import ServerConfig
from .errors import APIError, error_body
from .metrics import Metrics
from .provider import Endpoint, ServedModel
from .scheduler import QueueFull, StreamEvent, Submission

log = logging.getLogger("sparsellm.server")
CLIENT_CLOSED = 499  # nginx's status for a request whose client went away first
OPENAI_FINISH = {"stop": "stop", "length": "length", "capacity": "length", "cancelled": "stop"}


@dataclass
class ServerState:
    config: ServerConfig
    endpoints: list[Endpoint]
    metrics: Metrics = field(default_factory=Metrics)
    models: dict[str, ServedModel] = field(default_factory=dict)
    ready: bool = False
    load_error: str | None = None
    draining: bool = False
    inflight: int = 0  # HTTP requests being handled (for the SIGTERM drain)

    # ---- models ---------------------------------------------------------------------------------
    def start(self, served: list[ServedModel]) -> None:
        """Serve these loaded models: their schedulers run from now on."""
        for m in served:
            m.scheduler.start()
        self.models = {m.name: m for m in served}
        self.ready = True
        log.info("ready: serving %s", ", ".join(self.models))

    def stop(self) -> None:
        for m in self.models.values():
            m.scheduler.stop()

    def model(self, name: str | None) -> ServedModel:
        """The served model called `name` (the first endpoint when None)."""
        names = [e.name for e in self.endpoints]
        if name is not None and name not in names:
            shown = name if len(name) <= 200 else name[:200] + "..."
            raise APIError(404, f"model {shown!r} is not served here; served models (the ids "
                           f"of /v1/models): {', '.join(map(repr, names))}", param="model",
                           code="model_not_found")
        if not self.ready:
            if self.load_error:
                raise APIError(503, "the model failed to load; see the server log")
            raise APIError(503, "the model is still loading; retry shortly",
                           headers={"Retry-After": "2"})
        return self.models[name or names[0]]

    def gauges(self) -> dict[str, tuple[int, int]]:
        return {name: m.scheduler.counts() for name, m in self.models.items()}

    def speculation(self) -> dict[str, SpeculationStats]:
        """The speculative decoding counts of the models that speculate."""
        return {name: m.pipeline.generator.speculation for name, m in self.models.items()
                if m.pipeline.generator.speculator is not None}

    # ---- requests -------------------------------------------------------------------------------
    @staticmethod
    def generation_config(served: ServedModel, **overrides: Any) -> GenerationConfig:
        try:
            return served.pipeline.config_for(**overrides)
        except ValueError as e:
            raise APIError(400, str(e)) from None

    @staticmethod
    def encode(served: ServedModel, prompt: str | list[dict[str, Any]], param: str) -> list[int]:
        try:
            return served.pipeline.encode_prompt(prompt)
        except ValueError as e:  # e.g. no chat template
            raise APIError(400, str(e), param=param) from None

    @staticmethod
    def check_context(served: ServedModel, prompt_ids: list[int], max_tokens: int | None,
                      param: str) -> int:
        """The number of new tokens to allow; 400 context_length_exceeded if it cannot fit."""
        limit, n = served.sequence_length, len(prompt_ids)
        if n == 0:
            raise APIError(400, "the prompt is empty (no tokens)", param=param)
        if max_tokens is None:
            if n >= limit:
                max_tokens = 1  # reported below
            else:
                return min(served.defaults.max_generated_tokens, limit - n)
        if n + max_tokens > limit:
            where = "messages" if param == "messages" else "prompt"
            raise APIError(
                400, f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {n + max_tokens} tokens ({n} in the {where}, {max_tokens} in the "
                f"completion). Please reduce the length of the {where} or the completion.",
                param=param, code="context_length_exceeded")
        return max_tokens

    def submit(self, served: ServedModel, requests: list[GenerationRequest]) -> Submission:
        try:
            submission = served.scheduler.submit(requests)
        except QueueFull:
            raise APIError(429, "the server is at capacity (all batch slots and queue places "
                           "are taken); retry shortly", code="rate_limit_exceeded",
                           headers={"Retry-After": "1"}) from None
        except ContextLengthError as e:
            raise APIError(400, str(e), code="context_length_exceeded") from None
        except ValueError as e:
            raise APIError(400, str(e)) from None
        self.metrics.add_prompt_tokens(served.name, sum(len(r.prompt_ids) for r in requests))
        return submission

    async def collect(self, request: Request, served: ServedModel,
                      submission: Submission) -> list[GenerationRequest]:
        """Wait until every request has finished (its text, tokens and logprobs are then on
        it); if the client disconnects first, cancel the generation and end the handler with
        a 499 (nginx's "client closed request", sent to no one, counted in /metrics): an
        answer built from unfinished requests could fail (a prompt not yet scored) and log a
        500 for a request nobody is waiting for."""

        async def gather() -> None:
            async for _, event in submission.events():
                if event.error:
                    raise APIError(500, event.error, type="server_error")

        task = asyncio.ensure_future(gather())
        watcher = asyncio.ensure_future(_wait_disconnect(request.receive))
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not task.done():  # the client went away (or the server is stopping)
                task.cancel()
                served.scheduler.cancel(submission)
                self.metrics.add_disconnect()
        if not task.done() or task.cancelled():
            raise APIError(CLIENT_CLOSED, "the client closed the request before its answer",
                           code="client_closed_request")
        task.result()  # re-raise a generation error
        return list(submission.requests)

    def stream(self, served: ServedModel, submission: Submission,
               format_event: Callable[[int, StreamEvent], list[dict[str, Any]]],
               closing: Callable[[], list[dict[str, Any]]]) -> EventStreamResponse:
        """Server-sent events: format_event(index, event) -> chunks, closing() -> last chunks."""

        async def body() -> AsyncIterator[str]:
            finished = False
            try:
                async for index, event in submission.events():
                    if event.error:
                        self.metrics.add_stream_error()
                        served.scheduler.cancel(submission)  # the other choices, if any
                        yield _sse(error_body(event.error, "server_error"))
                        finished = True
                        break
                    for chunk in format_event(index, event):
                        yield _sse(chunk)
                else:
                    for chunk in closing():
                        yield _sse(chunk)
                    finished = True
            except Exception:  # an error after the stream started: one error event, then [DONE]
                log.exception("error while streaming")
                self.metrics.add_stream_error()
                served.scheduler.cancel(submission)
                finished = True
                yield _sse(error_body("internal server error", "server_error"))
            finally:
                if not finished:  # the client went away (cancelled here) or stopped reading
                    served.scheduler.cancel(submission)
                    self.metrics.add_disconnect()
            yield "data: [DONE]\n\n"

        return EventStreamResponse(body())


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStreamResponse(StreamingResponse):
    """text/event-stream that always watches for the client going away, so a disconnect cancels
    the body generator (and with it the generation) at once, not at the next write."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str]):
        super().__init__(content, headers={"Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def run_stream() -> None:
                    # OSError: the client closed the connection during a write
                    with contextlib.suppress(OSError):
                        await self.stream_response(send)
                    tg.cancel_scope.cancel()

                tg.start_soon(run_stream)
                await _wait_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
