"""The one generation core: a batch of sequences advanced one engine step at a time.

New sequences wait in a queue and join between steps when a KV-cache slot is free; finished
ones leave at once. `generate()` (pipeline, CLI, benchmark) and the server's scheduler both drive
this same `BatchGenerator`.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..engine import ContextLengthError, Engine
from .config import GenerationConfig
from .sampling import Sampler, log_softmax
from .speculative import SpeculationStats, SpeculativeSequence, Speculator, speculator_for
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
    # the token's (log-probability, {token id: log-probability} of the top ones), when requested
    logprob: tuple[float, dict[int, float]] | None = None


@dataclass(eq=False)
class GenerationRequest:
    """One sequence being generated."""

    prompt_ids: list[int]
    config: GenerationConfig
    return_logits: bool = False
    logprobs: int | None = None  # record each token's log-probability and this many top ones
    # Also score the prompt: each prompt token after the first gets its log-probability (and
    # `logprobs` top ones) from the prefill's logits, in `prompt_logprobs`.
    score_prompt: bool = False
    # False: only score the prompt (no token is sampled); the last prompt token is then only a
    # target, so the prefill feeds len(prompt_ids) - 1 tokens.
    generate: bool = True
    on_event: Callable[[TokenEvent], None] | None = None
    id: int = field(default_factory=itertools.count().__next__)
    # state, filled in while generating
    slot: int | None = None
    output_ids: list[int] = field(default_factory=list)
    text: str = ""  # all text produced so far, stop strings removed
    finished_reason: str | None = None
    logits: list[np.ndarray] = field(default_factory=list)  # rows (n, vocab), when return_logits
    # per generated token: (its log-probability, {token id: log-probability} of the top ones)
    token_logprobs: list[tuple[float, dict[int, float]]] = field(default_factory=list)
    # with score_prompt: the same for prompt tokens 1.. (the first token has no prediction)
    prompt_logprobs: list[tuple[float, dict[int, float]]] = field(default_factory=list)

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
        self.history = list(request.prompt_ids)  # prompt + output, for repetition penalty
        self.fed = 0  # prompt tokens in the KV cache (the prompt is fed window by window)


class BatchGenerator:
    """Drives an `Engine` over many concurrent sequences.

    With a `draft` engine (same vocabulary, its own KV cache with as many slots), each decode
    step is speculative (speculative.py `Speculator` over drafters.py `DraftModel`): the draft
    proposes up to `num_speculative_tokens` tokens per sequence and the main model verifies them
    all in one batched step. With `adaptive_speculation` (the default) each sequence drafts as
    many tokens (0 to `num_speculative_tokens`) as its measured acceptance rate and the measured
    cost of drafting make worthwhile; False drafts `num_speculative_tokens` every step. Another
    drafting method (e.g. drafters.py `PromptLookup`) comes as a `speculator`.
    """

    def __init__(self, engine: Engine, tokenizer: Any, eos_token_ids: Sequence[int] = (),
                 draft: Engine | None = None, num_speculative_tokens: int = 4,
                 adaptive_speculation: bool = True, speculator: Speculator | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.waiting: deque[GenerationRequest] = deque()
        self.active: dict[GenerationRequest, _Live] = {}
        if draft is not None:
            if speculator is not None:
                raise ValueError("give a draft engine or a speculator, not both")
            speculator = speculator_for(engine, tokenizer, draft, False, num_speculative_tokens,
                                        adaptive_speculation)
        self.speculator = speculator

    @property
    def speculation(self) -> SpeculationStats:
        """Counts of drafted and accepted tokens (zeros without speculation)."""
        return self.speculator.stats if self.speculator else SpeculationStats()

    @speculation.setter
    def speculation(self, stats: SpeculationStats) -> None:
        if self.speculator:
            self.speculator.stats = stats

    # ---- queue ----------------------------------------------------------------------------------
    def check_fits(self, prompt_ids: Sequence[int], generate: bool = True) -> None:
        """A prompt to generate from needs room for one new token; one only scored fits
        sequence_length + 1 tokens (its last one is never fed)."""
        n, limit = len(prompt_ids), self.engine.sequence_length
        if n == 0:
            raise ValueError("the prompt is empty (no tokens)")
        if not generate and n > limit + 1:
            raise ContextLengthError(
                f"the prompt has {n} tokens but sequence_length is {limit}: at most {limit + 1} "
                "tokens can be scored; shorten the prompt or raise sequence_length", n, limit,
            )
        if generate and n >= limit:
            raise ContextLengthError(
                f"the prompt has {n} tokens but sequence_length is {limit}: no room to generate; "
                "shorten the prompt or raise sequence_length", n, limit,
            )

    def add(self, request: GenerationRequest) -> GenerationRequest:
        self.check_fits(request.prompt_ids, request.generate)
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

    @property
    def prefilling(self) -> int:
        """Requests in a slot whose prompt is not all fed yet."""
        return sum(live.fed < _fed_length(r) for r, live in self.active.items())

    # ---- stepping -------------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        """One batched decode step of the decoding sequences, then prompt tokens, first come
        first served: prompts already begun before new ones.

        Each event goes to its request's `on_event` as soon as it exists: a stream's first token
        leaves when its own prompt is done, not when every prompt fed with it is. While
        sequences are decoding, a step feeds at most `engine.prompt_chunk` prompt tokens (at
        least one window): short prompts are admitted a few per step, and a long one is fed one
        window of `prompt_chunk` tokens per step, so the decoding sequences wait at most about
        one chunk's prefill for their next token however long the prompts that arrive
        (llama-server's batch of prompt tokens and vLLM's chunked prefill are the same idea).
        With nothing decoding, every waiting prompt that has a free slot is fed whole. A
        prompt's windows are cut where the engine's own prefill cuts it, so its logits are the
        same bits either way. Returns the step's events."""
        events: list[TokenEvent] = []

        def emit(event: TokenEvent) -> None:
            events.append(event)
            if event.request.on_event:
                event.request.on_event(event)

        decoding = [r for r, live in self.active.items() if live.next_token is not None]
        speculated = None
        if decoding and self.speculator is not None and self.speculator.drafts(decoding):
            speculated = self._speculative_step(decoding)
        if speculated is not None:
            for event in speculated:
                emit(event)
        elif decoding:
            began = time.perf_counter()
            tokens = [self.active[r].next_token for r in decoding]
            logits = self.engine.decode_step([r.slot for r in decoding], tokens)
            if self.speculator is not None:  # (before _advance may finish and release some)
                self.speculator.decoded_plainly(decoding, time.perf_counter() - began)
            for r, row in zip(decoding, logits, strict=True):
                emit(self._advance(r, row))
        budget = self.engine.prompt_chunk if decoding else None  # prompt tokens this step
        spent = 0
        while (prompt := self._next_prompt(whole=budget is None)) is not None:
            r, stop = prompt
            fed = self.active[r].fed if r in self.active else 0
            if budget is not None and spent and spent + stop - fed > budget:
                break
            if r not in self.active:
                self._admit(r)
            spent += stop - fed
            event = self._feed(r, stop)
            if event is not None:
                emit(event)
        return events

    def _next_prompt(self, whole: bool) -> tuple[GenerationRequest, int] | None:
        """The request whose prompt is fed next (one begun already, else the first waiting one
        if a slot is free) and where its next window ends (`whole`: the prompt's end)."""
        chunk = self.engine.prompt_chunk
        for r, live in self.active.items():
            n = _fed_length(r)
            if live.fed < n:
                return r, n if whole else min(live.fed + chunk, n)
        if self.waiting and self.engine.cache.num_free:
            r = self.waiting[0]
            n = _fed_length(r)
            return r, n if whole else min(chunk, n)
        return None

    def _admit(self, r: GenerationRequest) -> None:
        """Move the first waiting request into a KV-cache slot."""
        assert self.waiting[0] is r
        self.waiting.popleft()
        r.slot = self.engine.add_sequence()
        self.active[r] = _Live(r, self.tokenizer)
        if r.generate and self.speculator is not None:
            self.speculator.start(r, r.prompt_ids)

    def _feed(self, r: GenerationRequest, stop: int) -> TokenEvent | None:
        """Feed r's prompt up to token `stop`; when that is all of it, sample the first token
        (or, for a prompt only scored, finish) and return its event."""
        live = self.active[r]
        last = self._prefill(r, live.fed, stop) if stop > live.fed else None
        live.fed = stop
        if stop < _fed_length(r):
            return None
        if not r.generate:  # rows predicting tokens 1..n-1 are recorded: nothing to sample
            return self._finish(r, FINISH_LENGTH)
        assert last is not None
        return self._advance(r, last)

    def _prefill(self, r: GenerationRequest, start: int, stop: int) -> np.ndarray:
        """Feed r's prompt tokens start..stop - 1 (start: where a window begins) into r's slot
        -> the last one's logits (vocab,).

        What r asks of the prompt's logits (`return_logits`, `score_prompt`) is taken from each
        window of `engine.prompt_chunk` tokens as soon as it is computed, and the window's
        logits are dropped before the next runs: scoring holds one chunk of logits however
        long the prompt (2,048 tokens at once would be ~400 MB with a 49k vocabulary). The
        windows start where the engine's own prefill would cut the prompt, so each is the same
        native step and the logits the same bits as one prefill of the whole prompt.
        """
        tokens = r.prompt_ids
        if not (r.return_logits or r.score_prompt):
            return self.engine.prefill(r.slot, tokens[start:stop])[-1]
        chunk = self.engine.prompt_chunk
        for at in range(start, stop, chunk):
            logits = self.engine.prefill(r.slot, tokens[at:min(at + chunk, stop)],
                                         all_logits=True)
            self._record_prompt(r, at, logits)
            last = logits[-1].copy()  # a copy, not a view that would keep the chunk alive
            del logits  # before the next window's logits are allocated
        return last

    def _record_prompt(self, r: GenerationRequest, start: int, logits: np.ndarray) -> None:
        """logits (k, vocab) of prompt tokens start.. start + k - 1: row i predicts prompt token
        start + i + 1 (the prompt's last row predicts the first generated token: not kept)."""
        rows = logits[:len(r.prompt_ids) - 1 - start]
        if r.return_logits:
            r.logits.append(rows.copy())
        if r.score_prompt:
            top = r.logprobs or 0
            targets = r.prompt_ids[start + 1:start + 1 + len(rows)]
            r.prompt_logprobs += [_logprobs(row, token, top)
                                  for row, token in zip(rows, targets, strict=True)]

    def _advance(self, r: GenerationRequest, logits: np.ndarray) -> TokenEvent:
        """Sample the next token of r from `logits` and emit it."""
        live = self.active[r]
        token = live.sampler(logits, live.history)
        return self._emit(r, token, logits)

    def _speculative_step(self, decoding: list[GenerationRequest]) -> list[TokenEvent] | None:
        """Each sequence gets its accepted drafted tokens and the main model's next one; None
        if nothing was drafted (the step then decodes plainly)."""
        assert self.speculator is not None
        seqs = []
        for r in decoding:
            live = self.active[r]
            # drafts: what its token budget and the main cache can still take, minus the token
            # the main model always adds
            room = min(r.config.max_generated_tokens - len(r.output_ids),
                       self.engine.sequence_length - self.engine.length(r.slot)) - 1
            seqs.append(SpeculativeSequence(r, r.slot, live.next_token, room, live.sampler,
                                            live.history))
        verified = self.speculator.step(self.engine, seqs)
        if verified is None:
            return None
        events = []
        for r, kept in zip(decoding, verified, strict=True):
            for token, row in zip(kept.tokens, kept.logits, strict=False):
                event = self._emit(r, token, row)
                events.append(event)
                if event.finished_reason:
                    break
        return events

    def _emit(self, r: GenerationRequest, token: int, logits: np.ndarray) -> TokenEvent:
        """Append the chosen `token` to r and update its text and finish state."""
        if r.return_logits:
            r.logits.append(logits[None].copy())
        logprob = None
        if r.logprobs is not None:
            logprob = _logprobs(logits, token, r.logprobs)
            r.token_logprobs.append(logprob)
        event = self._append(r, token)
        event.logprob = logprob
        return event

    def _append(self, r: GenerationRequest, token: int) -> TokenEvent:
        live = self.active[r]
        live.next_token = None
        r.output_ids.append(token)
        live.history.append(token)
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
        if self.speculator is not None:
            self.speculator.release(r)
        return TokenEvent(r, token, text, reason)

    # ---- convenience ----------------------------------------------------------------------------
    def run(self, requests: Sequence[GenerationRequest]) -> list[GenerationRequest]:
        """Generate all `requests` to completion (as a batch, `max_sequences` at a time)."""
        for r in requests:
            self.check_fits(r.prompt_ids, r.generate)
        for r in requests:
            self.add(r)
        while self.has_work:
            self.step()
        return list(requests)


def _fed_length(r: GenerationRequest) -> int:
    """Prompt tokens a request feeds: all, or all but the last when it is only scored (the
    last one is then only a target)."""
    return len(r.prompt_ids) if r.generate else len(r.prompt_ids) - 1


def _logprobs(logits: np.ndarray, token: int, top: int) -> tuple[float, dict[int, float]]:
    """The model's log-probability of `token` (before sampling filters) and the `top` best."""
    logp = log_softmax(logits)
    best = np.argpartition(-logp, top)[:top] if top else np.array([], dtype=np.int64)
    best = best[np.argsort(-logp[best])]
    return float(logp[token]), {int(i): float(logp[i]) for i in best}
