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

from .engine import Engine
from .engine.engine import DEFAULT_PROMPT_CHUNK
from .generation import BatchGenerator, GenerationConfig, GenerationRequest, TokenEvent
from .generation.drafters import draft_engine
from .generation.speculative import speculator_for
from .models import DEFAULT_MODEL, Checkpoint, load_checkpoint

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
    def create(task: str = "text-generation", model_path: str | Path | Checkpoint = DEFAULT_MODEL,
               **kwargs: Any) -> TextGeneration:
        if task.lower() not in TEXT_GENERATION_TASKS:
            raise ValueError(
                f"unknown task {task!r}; supported: {', '.join(TEXT_GENERATION_TASKS)}"
            )
        return TextGeneration(model_path, **kwargs)


class TextGeneration(Pipeline):
    """Generate text with a causal LM.

    Construction settings size the engine (`sequence_length` tokens per sequence, `batch_size`
    sequences decoded together, prompts processed `prompt_processing_sequence_length` tokens at
    a time, `num_cores` threads; `sequence_length` defaults to an exported deployment's, else
    1024). `weights` (a `sparsellm.kernels.FORMATS` name, e.g. "int8_a8") converts every linear
    weight on load instead of running the checkpoint's declared formats (converted weights are
    cached for the next load in `weights_cache`: True for the default folder, a folder, or
    False; see `Engine`); `kv_cache_dtype="fp16"`
    (or "int8") stores the KV cache in half precision (int8: per-token scales), for half (a
    quarter of) the memory. Any `GenerationConfig`
    field passed here becomes a default that each call can override. With `draft_model_path` (a
    smaller or compressed model with the same tokenizer; "auto": the model itself in a smaller
    format, `draft_weights` or else generation.drafters.SELF_DRAFT_WEIGHTS; `draft_weights`
    converts any draft's weights) or `prompt_lookup=True` (n-gram matches
    in the prompt and the text so far; with a draft model too, lookup first and the draft where
    lookup finds nothing) decoding is speculative: up to `num_speculative_tokens` tokens are
    drafted per step and the model verifies them; outputs are those of the model alone. With
    `adaptive_speculation` (the default) each sequence drafts as many tokens as its measured
    acceptance and the cost of drafting make worthwhile, none where it does not pay; False
    drafts `num_speculative_tokens` every step.
    """

    def __init__(
        self,
        model_path: str | Path | Checkpoint = DEFAULT_MODEL,
        sequence_length: int | None = None,
        prompt_processing_sequence_length: int = DEFAULT_PROMPT_CHUNK,
        batch_size: int = 4,
        num_cores: int | None = None,
        weights: str | None = None,
        weights_cache: str | Path | bool = True,
        kv_cache_dtype: str = "fp32",
        internal_kv_cache: bool = True,  # accepted for DeepSparse compatibility; always internal
        generation_config: GenerationConfig | dict[str, Any] | None = None,
        draft_model_path: str | Path | Checkpoint | None = None,
        draft_weights: str | None = None,
        num_speculative_tokens: int = 4,
        adaptive_speculation: bool = True,
        prompt_lookup: bool = False,
        **generation_kwargs: Any,
    ):
        if isinstance(generation_config, dict):
            generation_config = GenerationConfig.from_kwargs(**generation_config)
        self.generation_config = GenerationConfig.from_kwargs(
            generation_config, **generation_kwargs
        )
        checkpoint = model_path if isinstance(model_path, Checkpoint) else \
            load_checkpoint(model_path)
        self.model_path = str(checkpoint.path)
        if sequence_length is None:  # an exported deployment's, else 1024
            sequence_length = int(checkpoint.deployment.get("sequence_length", 1024))
        self.engine = Engine(
            checkpoint,
            sequence_length=sequence_length,
            max_sequences=batch_size,
            prompt_processing_sequence_length=prompt_processing_sequence_length,
            num_cores=num_cores,
            weights=weights,
            weights_cache=weights_cache,
            kv_cache_dtype=kv_cache_dtype,
        )
        self.tokenizer = checkpoint.tokenizer
        self.sequence_length = sequence_length
        self.draft_engine = None
        if draft_model_path is not None:
            self.draft_engine = draft_engine(
                draft_model_path, self.engine, draft_weights, sequence_length=sequence_length,
                max_sequences=batch_size,
                prompt_processing_sequence_length=prompt_processing_sequence_length,
                num_cores=num_cores, kv_cache_dtype=kv_cache_dtype, weights_cache=weights_cache,
            )
        speculator = speculator_for(self.engine, self.tokenizer, self.draft_engine,
                                    prompt_lookup, num_speculative_tokens, adaptive_speculation)
        self.generator = BatchGenerator(self.engine, self.tokenizer, checkpoint.eos_token_ids,
                                        speculator=speculator)

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

    def _stream(self, prompt: str, req: GenerationRequest,
                session_id: str) -> Iterator[TextGenerationOutput]:
        self.generator.add(req)
        try:
            while not req.finished:
                for event in self.generator.step():
                    if event.request is req and (event.text or event.finished_reason):
                        gen = GeneratedText(event.text, req.finished, req.finished_reason,
                                            [event.token_id] if event.token_id is not None else [])
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
