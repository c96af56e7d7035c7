"""Continuous batching for the server: one thread per model drives its `BatchGenerator`.

The thread runs `generator.step()` in a loop while there is work, holding `lock`. Requests and
cancellations from the event loop go into thread-safe inboxes that the thread moves into the
generator under the same lock, between steps, so the event loop never waits for a step: new
requests join at the next step, cancelled ones leave before it. Each request's events are
handed to the asyncio side with `loop.call_soon_threadsafe` into its own `asyncio.Queue`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from ..generation import BatchGenerator, GenerationRequest, TokenEvent
from .metrics import Metrics

log = logging.getLogger("sparsellm.server")


class QueueFull(Exception):
    """More requests than batch slots + queue places."""


@dataclass
class StreamEvent:
    """One step's output for one request, as the asyncio side sees it."""

    token_id: int | None
    text: str
    finished_reason: str | None = None
    # (log-probability of the token, {token id: log-probability} of the top ones)
    logprob: tuple[float, dict[int, float]] | None = None
    error: str | None = None

    @property
    def last(self) -> bool:
        return self.finished_reason is not None or self.error is not None


class Submission:
    """The asyncio end of the requests of one HTTP call (several for `n` > 1 or many prompts).

    Events of all its requests, tagged with the request's index, go into one deque. The
    scheduler thread wakes the event loop with `call_soon_threadsafe` only when no wake-up is
    already pending, so a busy loop takes many tokens per wake-up instead of one each.
    """

    def __init__(self, requests: Sequence[GenerationRequest], loop: asyncio.AbstractEventLoop):
        self.requests = list(requests)
        self.loop = loop
        self._pending: collections.deque[tuple[int, StreamEvent]] = collections.deque()
        self._ready = asyncio.Event()
        self._wake_scheduled = False
        self.streams = [_Stream(self, i, r) for i, r in enumerate(self.requests)]

    def put(self, index: int, event: StreamEvent) -> None:
        """Called from the scheduler thread."""
        self._pending.append((index, event))
        if not self._wake_scheduled:
            self._wake_scheduled = True
            # RuntimeError: the event loop is gone (server shutting down)
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._wake_scheduled = False
        self._ready.set()

    async def events(self) -> AsyncIterator[tuple[int, StreamEvent]]:
        """(request index, event) until every request has finished or failed."""
        left = len(self.streams)
        while left:
            if not self._pending:
                self._ready.clear()
                if not self._pending:
                    await self._ready.wait()
                continue
            index, event = self._pending.popleft()
            yield index, event
            left -= event.last


class _Stream:
    """Scheduler-side state of one request."""

    def __init__(self, submission: Submission, index: int, request: GenerationRequest):
        self.submission, self.index, self.request = submission, index, request
        self.submitted = time.perf_counter()
        self.first_token: float | None = None
        self.done = False

    def put(self, event: StreamEvent) -> None:
        self.submission.put(self.index, event)


class Scheduler:
    """Owns one model's generator; `submit` and `cancel` are safe to call from the event loop."""

    def __init__(self, generator: BatchGenerator, name: str, max_queue: int,
                 metrics: Metrics | None = None):
        self.generator = generator
        self.name = name
        self.capacity = generator.engine.max_sequences + max_queue
        self.metrics = metrics or Metrics()
        self.lock = threading.Lock()  # guards the generator
        self._wake = threading.Event()
        self._inbox: collections.deque[_Stream] = collections.deque()
        self._cancels: collections.deque[_Stream] = collections.deque()
        self._streams: dict[GenerationRequest, _Stream] = {}  # submitted, not yet finished
        self._count_lock = threading.Lock()
        self._inflight = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"scheduler-{name}", daemon=True)

    # ---- event-loop side ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, requests: Sequence[GenerationRequest]) -> Submission:
        """Queue requests (all or none); raises QueueFull, or ContextLengthError/ValueError for a
        prompt that cannot fit. Call from the event loop."""
        for r in requests:
            self.generator.check_fits(r.prompt_ids, r.generate)
        with self._count_lock:
            if self._stopping or self._inflight + len(requests) > self.capacity:
                raise QueueFull(self.name)
            self._inflight += len(requests)
        submission = Submission(requests, asyncio.get_running_loop())
        for s in submission.streams:
            s.request.on_event = self._make_callback(s)
            self._inbox.append(s)
        self._wake.set()
        return submission

    def cancel(self, submission: Submission) -> None:
        """Stop these requests before the next step (their client went away)."""
        pending = [s for s in submission.streams if not s.done]
        if pending:
            self._cancels.extend(pending)
            self._wake.set()

    @property
    def inflight(self) -> int:
        return self._inflight

    def counts(self) -> tuple[int, int]:
        """(active, waiting) requests right now."""
        return len(self.generator.active), len(self.generator.waiting) + len(self._inbox)

    # ---- scheduler thread -----------------------------------------------------------------------
    def _make_callback(self, stream: _Stream):  # noqa: ANN202
        def on_event(event: TokenEvent) -> None:
            self._dispatch(stream, event)
        return on_event

    def _dispatch(self, stream: _Stream, event: TokenEvent) -> None:
        if event.token_id is not None:
            self.metrics.add_tokens(self.name, 1)
            if stream.first_token is None:
                stream.first_token = time.perf_counter()
                self.metrics.observe_ttft(self.name, stream.first_token - stream.submitted)
        if event.finished_reason is not None:
            self._done(stream)
        stream.put(StreamEvent(event.token_id, event.text, event.finished_reason, event.logprob))

    def _done(self, stream: _Stream) -> None:
        if stream.done:
            return
        stream.done = True
        self._streams.pop(stream.request, None)
        with self._count_lock:
            self._inflight -= 1

    def _fail(self, stream: _Stream, message: str) -> None:
        self._done(stream)
        stream.put(StreamEvent(None, "", None, error=message))

    def _admit(self) -> None:
        while self._inbox:
            s = self._inbox.popleft()
            try:
                self.generator.add(s.request)
                self._streams[s.request] = s
            except Exception as e:  # noqa: BLE001 -- submit checked; report, do not crash
                self._fail(s, str(e))
        while self._cancels:
            s = self._cancels.popleft()
            if not s.done:
                self.generator.cancel(s.request)
                self._done(s)

    def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()
            with self.lock:
                self._admit()
                busy = self.generator.has_work
                if busy:
                    try:
                        self.generator.step()
                    except Exception:
                        log.exception("generation step failed on %s", self.name)
                        self._abort_all("generation failed; the request was stopped")
            if not busy:
                self._wake.wait(1.0)
        with self.lock:
            self._admit()
            self._abort_all("the server is shutting down")

    def _abort_all(self, message: str) -> None:
        for stream in list(self._streams.values()):
            try:
                self.generator.cancel(stream.request)
            except Exception:  # noqa: BLE001 -- the generator may be inconsistent after a failure
                log.exception("cancel failed")
            self._fail(stream, message)
        self.generator.waiting.clear()
        self.generator.active.clear()
