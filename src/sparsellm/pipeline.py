"""Pipeline / TextGeneration: text in, text out.

    pipeline = Pipeline.create(task="text-generation", model_path="smollm2-135m-instruct")
    out = pipeline(sequences=["def fibonacci(n):"])
    out.sequences[0], out.generations[0].finished_reason
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .engine import EngineSettings
from .generation import GenerationConfig, GenerationRequest, TokenEvent, build_stack
from .generation.speculative import SpeculationStats
from .models import Checkpoint

TEXT_GENERATION_TASKS = ("text-generation", "text_generation", "textgeneration", "chat")


class Streamer(Protocol):
    """What `streamer=` accepts: transformers' TextStreamer, or anything with put() and end()."""

    def put(self, value: np.ndarray) -> None: ...
    def end(self) -> None: ...


@dataclass
class GeneratedText:
    text: str
    finished: bool
    # "stop" | "length" | "capacity" | "cancelled"; None while streaming
    finished_reason: str | None
    token_ids: list[int] = field(default_factory=list)


@dataclass
class TextGenerationOutput:
    """`sequences` holds the generated strings (DeepSparse's output field, set from
    `generations`, which has the same with finish details)."""

    prompts: list[str]
    generations: list[GeneratedText]
    logits: np.ndarray | None = None  # (batch, tokens, vocab): row i predicts token i+1
    session_id: str | None = None
    created: float = field(default_factory=time.time)
    sequences: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.sequences = [g.text for g in self.generations]


class Pipeline:
    """Entry point familiar to DeepSparse users: `Pipeline.create(task=..., model_path=...)`."""

    @staticmethod
    def create(task: str = "text-generation", model_path: str | Path | Checkpoint | None = None,
               **kwargs: Any) -> TextGeneration:
        """`kwargs`: those of `TextGeneration` (engine settings, generation defaults)."""
        if task.lower() not in TEXT_GENERATION_TASKS:
            raise ValueError(
                f"unknown task {task!r}; supported: {', '.join(TEXT_GENERATION_TASKS)}"
            )
        return TextGeneration(model_path, **kwargs)


class TextGeneration(Pipeline):
    """Generate text with a causal LM.

    Keyword arguments are engine settings (any `sparsellm.engine.EngineSettings` field:
    `sequence_length` tokens per sequence, `batch_size` sequences decoded together, prompts
    processed `prompt_processing_sequence_length` tokens at a time, `num_cores` threads,
    `weights` to convert every linear weight on load (e.g. "int8_a8"), `weights_cache`,
    `kv_cache_dtype="fp16"` or "int8", and speculative decoding: `draft_model_path` (a smaller
    or compressed model with the same tokenizer, or "auto": the model itself in a smaller
    format, `draft_weights`), `prompt_lookup`, `num_speculative_tokens`,
    `adaptive_speculation`; each field's help says more) or generation defaults (any
    `GenerationConfig` field, which each call can override; or `generation_config`).
    `settings`: an `EngineSettings` (or a subclass) the keyword arguments are applied over;
    `model_path` replaces its model. With speculative decoding, outputs are those of the model
    alone.
    """

    def __init__(
        self,
        model_path: str | Path | Checkpoint | None = None,
        *,
        settings: EngineSettings | None = None,
        generation_config: GenerationConfig | dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        settings = settings or EngineSettings()
        names = set(settings.names())
        engine = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
        if isinstance(generation_config, dict):
            generation_config = GenerationConfig.from_kwargs(**generation_config)
        self.generation_config = GenerationConfig.from_kwargs(generation_config, **kwargs)
        stack = build_stack(settings.replace(model_path=model_path, **engine))
        self.settings = stack.settings
        self.model_path = str(stack.checkpoint.path)
        self.engine = stack.engine
        self.draft_engine = stack.draft_engine
        self.generator = stack.generator
        self.tokenizer = stack.checkpoint.tokenizer
        self.sequence_length = stack.settings.sequence_length

    @property
    def speculation(self) -> SpeculationStats | None:
        """Drafted and accepted token counts so far; None without speculative decoding."""
        return self.generator.speculation if self.generator.speculator is not None else None

    # ---- inputs ---------------------------------------------------------------------------------
    def config_for(self, **overrides: Any) -> GenerationConfig:
        return GenerationConfig.from_kwargs(self.generation_config, **overrides)

    def encode_prompt(self, prompt: str | list[dict[str, Any]]) -> list[int]:
        """A string is tokenized as is; a list of chat messages goes through the chat template."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        return self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True)

    def request(self, prompt: str | list[dict[str, Any]], config: GenerationConfig,
                return_logits: bool = False) -> GenerationRequest:
        return GenerationRequest(self.encode_prompt(prompt), config, return_logits=return_logits)

    # ---- calls ----------------------------------------------------------------------------------
    def __call__(
        self,
        sequences: str | Sequence[str] | None = None,
        *,
        prompt: str | Sequence[str] | None = None,
        streamer: Streamer | None = None,
        streaming: bool = False,
        return_logits: bool = False,
        fixed_sequences_length: bool = False,
        session_id: str | None = None,
        **generation_kwargs: Any,
    ) -> TextGenerationOutput | Iterator[TextGenerationOutput]:
        """Generate for one prompt or a list. `streaming=True` yields partial outputs instead."""
        if sequences is None:
            sequences = prompt
        if sequences is None:
            raise ValueError("pass the prompt(s) as `sequences` (or `prompt`)")
        prompts = [sequences] if isinstance(sequences, str) else list(sequences)
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError("sequences must be a string or a non-empty list of strings")
        config = self.config_for(**generation_kwargs)
        requests = [self.request(p, config, return_logits) for p in prompts]
        session_id = session_id or str(uuid.uuid4())
        if streaming:
            if len(requests) != 1 or return_logits:
                raise ValueError("streaming=True takes a single prompt and no return_logits")
            return self._stream(prompts[0], requests[0], session_id)
        if streamer is not None:
            if len(requests) != 1:
                raise ValueError("a streamer takes a single prompt (as in transformers)")
            req = requests[0]
            streamer.put(np.asarray([req.prompt_ids]))

            def put_token(event: TokenEvent) -> None:
                if event.token_id is not None:
                    streamer.put(np.asarray([event.token_id]))

            req.on_event = put_token
        try:
            self.generator.run(requests)
        finally:
            if streamer is not None:
                streamer.end()
        logits = None
        if return_logits:
            logits = stacked_logits(requests,
                                    self.sequence_length if fixed_sequences_length else None)
        return TextGenerationOutput(
            prompts=prompts,
            generations=[GeneratedText(r.text, True, r.finished_reason, r.output_ids)
                         for r in requests],
            logits=logits,
            session_id=session_id,
        )

    def stream(self, prompt: str | list[dict[str, Any]], *, session_id: str | None = None,
               **generation_kwargs: Any) -> Iterator[TextGenerationOutput]:
        """Partial outputs of one prompt (a string, or chat messages through the chat template)
        as its text comes: each holds the new text and the tokens generated since the last one;
        the last one says why generation finished. Closing the iterator early cancels it."""
        req = self.request(prompt, self.config_for(**generation_kwargs))
        label = prompt if isinstance(prompt, str) else self.tokenizer.decode(req.prompt_ids)
        return self._stream(label, req, session_id or str(uuid.uuid4()))

    def _stream(self, prompt: str, req: GenerationRequest,
                session_id: str) -> Iterator[TextGenerationOutput]:
        self.generator.add(req)
        token_ids: list[int] = []  # generated since the last output (some have no text yet)
        try:
            while not req.finished:
                for event in self.generator.step():
                    if event.request is not req:
                        continue
                    if event.token_id is not None:
                        token_ids.append(event.token_id)
                    if event.text or event.finished_reason:
                        gen = GeneratedText(event.text, req.finished, req.finished_reason,
                                            token_ids)
                        token_ids = []
                        yield TextGenerationOutput([prompt], [gen], session_id=session_id)
        finally:
            if not req.finished:  # the consumer stopped early
                self.generator.cancel(req)
                while self.generator.has_work:  # nothing else owns this generator
                    self.generator.step()


def stacked_logits(requests: Sequence[GenerationRequest], length: int | None = None
                   ) -> np.ndarray:
    """The logits of finished return_logits requests as one (batch, tokens, vocab) array, each
    request's (prompt + generated, vocab) rows zero-padded on the left to the longest (or to
    `length`)."""
    return _stack_left_padded([np.concatenate(r.logits) for r in requests], length)


def _stack_left_padded(rows: list[np.ndarray], length: int | None) -> np.ndarray:
    """Stack (n_i, vocab) arrays into (batch, max n or `length`, vocab), zero-padded on the left."""
    n = max(length or 0, *(r.shape[0] for r in rows))
    out = np.zeros((len(rows), n, rows[0].shape[1]), dtype=np.float32)
    for i, r in enumerate(rows):
        out[i, n - r.shape[0]:] = r
    return out
