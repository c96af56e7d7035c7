"""The one generation core: a batch of sequences advanced one engine step at a time.

New sequences wait in a queue and join between steps when a KV-cache slot is free; finished
ones leave at once. `generate()` (pipeline, CLI, benchmark) and the server's scheduler both drive
this same `BatchGenerator`.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..engine import ContextLengthError, Engine
from .config import GenerationConfig
from .sampling import Sampler
from .text import IncrementalDetokenizer, StopStrings

FINISH_STOP, FINISH_LENGTH, FINISH_CAPACITY, FINISH_CANCELLED = "stop", "length", "capacity", \
    "cancelled"


@dataclass
class TokenEvent:
    """What one step produced for one sequence."""

    request: GenerationRequest
    token_id: int | None  # None when the event only carries a finish
    text: str  # new text safe to show (may be empty while a character or stop string is pending)
    finished_reason: str | None = None


@dataclass(eq=False)
class GenerationRequest:
    """One sequence being generated."""

    prompt_ids: list[int]
    config: GenerationConfig
    return_logits: bool = False
    on_event: Callable[[TokenEvent], None] | None = None
    id: int = field(default_factory=itertools.count().__next__)
    # state, filled in while generating
    slot: int | None = None
    output_ids: list[int] = field(default_factory=list)
    text: str = ""  # all text produced so far, stop strings removed
    finished_reason: str | None = None
    logits: list[np.ndarray] = field(default_factory=list)  # rows (n, vocab), when return_logits

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None


class _Live:
    """Per-sequence machinery that lives only while the sequence is in a slot."""

    def __init__(self, request: GenerationRequest, tokenizer: Any):
        self.sampler = Sampler(request.config)
        self.detok = IncrementalDetokenizer(tokenizer, request.prompt_ids)
        self.stops = StopStrings(request.config.stop)
        self.pending = ""  # decoded text not yet released (could begin a stop string)
        self.next_token: int | None = None  # sampled, not yet fed to the engine


class BatchGenerator:
    """Drives an `Engine` over many concurrent sequences."""

    def __init__(self, engine: Engine, tokenizer: Any, eos_token_ids: Sequence[int] = ()):
        self.engine = engine
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.waiting: deque[GenerationRequest] = deque()
        self.active: dict[GenerationRequest, _Live] = {}

    # ---- queue ----------------------------------------------------------------------------------
    def check_fits(self, prompt_ids: Sequence[int]) -> None:
        n, limit = len(prompt_ids), self.engine.sequence_length
        if n == 0:
            raise ValueError("the prompt is empty (no tokens)")
        if n >= limit:
            raise ContextLengthError(
                f"the prompt has {n} tokens but sequence_length is {limit}: no room to generate; "
                "shorten the prompt or raise sequence_length", n, limit,
            )

    def add(self, request: GenerationRequest) -> GenerationRequest:
        self.check_fits(request.prompt_ids)
        self.waiting.append(request)
        return request

    def cancel(self, request: GenerationRequest) -> None:
        """Stop a request now (e.g. its client went away); frees its slot before the next step."""
        if request in self.active:
            self._finish(request, FINISH_CANCELLED, flush=False)
        elif request in self.waiting:
            self.waiting.remove(request)
            request.finished_reason = FINISH_CANCELLED

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.active)

    # ---- stepping -------------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        """Admit waiting requests (prefill + first token), then one batched decode step."""
        events: list[TokenEvent] = []
        decoding = [r for r, live in self.active.items() if live.next_token is not None]
        if decoding:
            tokens = [self.active[r].next_token for r in decoding]
            logits = self.engine.decode_step([r.slot for r in decoding], tokens)
            for r, row in zip(decoding, logits, strict=True):
                events.append(self._advance(r, row))
        while self.waiting and self.engine.cache.num_free:
            r = self.waiting.popleft()
            r.slot = self.engine.add_sequence()
            self.active[r] = _Live(r, self.tokenizer)
            logits = self.engine.prefill(r.slot, r.prompt_ids, all_logits=r.return_logits)
            if r.return_logits:
                r.logits.append(logits[:-1].copy())
            events.append(self._advance(r, logits[-1]))
        for event in events:
            if event.request.on_event:
                event.request.on_event(event)
        return events

    def _advance(self, r: GenerationRequest, logits: np.ndarray) -> TokenEvent:
        """Sample the next token of r from `logits` and update its text and finish state."""
        live = self.active[r]
        live.next_token = None
        if r.return_logits:
            r.logits.append(logits[None].copy())
        token = live.sampler(logits, r.prompt_ids + r.output_ids)
        r.output_ids.append(token)
        cfg = r.config
        if token in self.eos_token_ids and not cfg.force_max_tokens:
            return self._finish(r, FINISH_STOP, token)
        live.pending += live.detok.add(token)
        hit = live.stops.find(live.pending)
        if hit >= 0:
            live.pending = live.pending[:hit]
            return self._finish(r, FINISH_STOP, token, flush=False)
        if len(r.output_ids) >= cfg.max_generated_tokens:
            return self._finish(r, FINISH_LENGTH, token)
        if len(r.prompt_ids) + len(r.output_ids) >= self.engine.sequence_length:
            return self._finish(r, FINISH_CAPACITY, token)
        live.next_token = token
        safe = live.stops.safe_length(live.pending)
        text, live.pending = live.pending[:safe], live.pending[safe:]
        r.text += text
        return TokenEvent(r, token, text)

    def _finish(self, r: GenerationRequest, reason: str, token: int | None = None,
                flush: bool = True) -> TokenEvent:
        """End r: release the rest of its text (up to any stop string) and its KV-cache slot."""
        live = self.active.pop(r)
        text = live.pending
        if flush:
            text += live.detok.flush()
            hit = live.stops.find(text)
            text = text[:hit] if hit >= 0 else text
        if r.return_logits and reason != FINISH_CANCELLED and token is not None:
            # Feed the last token too, so logits line up with prompt + generated tokens.
            if self.engine.length(r.slot) + 1 <= self.engine.sequence_length:
                r.logits.append(self.engine.prefill(r.slot, [token]))
            else:
                r.logits.append(np.full((1, self.engine.vocab_size), np.nan, dtype=np.float32))
        r.text += text
        r.finished_reason = reason
        self.engine.release(r.slot)
        return TokenEvent(r, token, text, reason)

    # ---- convenience ----------------------------------------------------------------------------
    def run(self, requests: Sequence[GenerationRequest]) -> list[GenerationRequest]:
        """Generate all `requests` to completion (as a batch, `max_sequences` at a time)."""
        for r in requests:
            self.check_fits(r.prompt_ids)
        for r in requests:
            self.add(r)
        while self.has_work:
            self.step()
        return list(requests)
