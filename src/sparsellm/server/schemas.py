"""HTTP request and response models. Requests are strict: unknown keys and wrong types are 400s.

Names follow the APIs users already know: DeepSparse's text-generation pipeline for /predict,
OpenAI's for /v1 (plus vLLM's extensions `top_k`, `repetition_penalty`, `ignore_eos`).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

MAX_STOP = 4
MAX_INT = 2**31 - 1
MAX_PROMPTS = 64


def _stop_list(v: str | list[str] | None) -> list[str] | None:
    if v is None:
        return None
    stops = [v] if isinstance(v, str) else v
    if len(stops) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop strings are allowed, got {len(stops)}")
    if any(not s for s in stops):
        raise ValueError("stop strings must not be empty")
    return stops


# The limits are checked by _stop_list (one message with the limit and the count); the schema
# still states them.
Stop = Annotated[
    Annotated[list[Annotated[str, Field(json_schema_extra={"minLength": 1})]],
              Field(json_schema_extra={"maxItems": MAX_STOP})]
    | Annotated[str, Field(json_schema_extra={"minLength": 1})] | None,
    AfterValidator(_stop_list),
]
PosInt = Annotated[int, Field(ge=1, le=MAX_INT)]
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]
Temperature = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
GREEDY_BELOW = 1e-3  # temperatures this low are greedy (dividing logits by ~0 overflows)
TopP = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
TopK = Annotated[int, Field(ge=0, le=MAX_INT)]
Penalty = Annotated[float, Field(ge=0.01, le=100, allow_inf_nan=False)]
Prompt = Annotated[str, Field(min_length=1)]
Prompts = Annotated[list[Prompt], Field(min_length=1, max_length=MAX_PROMPTS)] | Prompt
# OpenAI's legacy completions also take token ids: one prompt as a list of ids, or a list of them
# (ids beyond the model's vocabulary are refused by the route, which knows it).
TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=MAX_INT)]], Field(min_length=1)]
TokenPrompts = TokenIds | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# ---- /predict (DeepSparse's pipeline schema) ----------------------------------------------------
class PredictRequest(StrictModel):
    """TextGenerationInput: one prompt or a list, plus per-request generation settings."""

    sequences: Prompts
    max_generated_tokens: PosInt | None = None
    force_max_tokens: bool | None = None
    deterministic: bool | None = None
    sampling_temperature: Annotated[float, Field(ge=GREEDY_BELOW, le=100,
                                                 allow_inf_nan=False)] | None = None
    top_k: TopK | None = None
    top_p: TopP | None = None
    repetition_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: Stop = None
    session_id: Annotated[str, Field(max_length=128)] | None = None
    return_logits: bool = False
    fixed_sequences_length: bool = False  # with return_logits: pad to the sequence length

    def generation_kwargs(self) -> dict[str, Any]:
        return self.model_dump(exclude={"sequences", "session_id", "return_logits",
                                        "fixed_sequences_length"}, exclude_none=True)


class GeneratedTextOut(BaseModel):
    text: str
    finished: bool
    finished_reason: str | None


class PredictResponse(BaseModel):
    """TextGenerationOutput: `sequences` holds the generated texts, `generations` the same with
    finish details; `logits` only with return_logits."""

    sequences: list[str]
    logits: list[list[list[float | None]]] | None = Field(
        None, description="(prompts, tokens, vocab), left-padded; row i predicts token i+1 "
                          "(null where a logit was not computed)")
    session_id: str
    prompts: list[str]
    generations: list[GeneratedTextOut]
    created: float


# ---- OpenAI --------------------------------------------------------------------------------------
class StreamOptions(StrictModel):
    include_usage: bool = False


class _Sampling(StrictModel):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    temperature: Temperature | None = None  # 0 (below GREEDY_BELOW) = greedy
    top_p: TopP | None = None
    n: PosInt = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    seed: Seed | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)] | None = None
    # extensions (vLLM names)
    top_k: TopK | None = None
    repetition_penalty: Penalty | None = None
    ignore_eos: bool = False

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _zero_only(cls, v: float | None) -> float | None:
        if v:
            raise ValueError("is not supported (only 0); use repetition_penalty instead")
        return v

    def sampling_kwargs(self) -> dict[str, Any]:
        """GenerationConfig overrides; unset fields keep the endpoint's defaults."""
        kw: dict[str, Any] = {}
        if self.temperature is not None:
            if self.temperature < GREEDY_BELOW:
                kw["deterministic"] = True
            else:
                kw.update(deterministic=False, sampling_temperature=self.temperature)
        elif self.top_p is not None and self.top_p < 1 or self.top_k:
            kw["deterministic"] = False
        for name in ("top_p", "top_k", "repetition_penalty", "seed", "stop"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        if self.ignore_eos:
            kw["force_max_tokens"] = True
        return kw


class CompletionRequest(_Sampling):
    """`prompt`: a string, a list of strings, a list of token ids or a list of such lists.
    `echo` with `logprobs` scores the prompt tokens too; `max_tokens: 0` (only with `echo`)
    scores without generating."""

    prompt: Prompts | TokenPrompts
    max_tokens: Annotated[int, Field(ge=0, le=MAX_INT)] | None = None
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool = False
    best_of: Annotated[int, Field(ge=1, le=1)] | None = None


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | Annotated[list[TextPart], Field(max_length=256)]
    name: Annotated[str, Field(max_length=64)] | None = None

    def as_template_input(self) -> dict[str, str]:
        content = self.content if isinstance(self.content, str) else \
            "".join(p.text for p in self.content)
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content}


class ChatCompletionRequest(_Sampling):
    """`messages` is a list of chat messages; a string (or `prompt` in place of messages) is one
    user message, as DeepSparse's OpenAI integration accepted."""

    # exactly one of the two (checked by the route; the schema says so with oneOf)
    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["messages"]},
                                                           {"required": ["prompt"]}]})

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=1024)] \
        | Prompt = None  # type: ignore[assignment]
    prompt: Prompt = None  # type: ignore[assignment]
    max_tokens: PosInt | None = None
    max_completion_tokens: PosInt | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


FinishReason = Literal["stop", "length"]


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy shape. With echo the prompt's tokens come first; its first token has no
    prediction, so its log-probability and top ones are null."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "sparsellm"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok", "loading", "failed", "draining"]
    detail: str | None = None


def finite(x: float) -> float:
    """JSON has no NaN/inf: clamp log-probabilities of impossible tokens."""
    return x if math.isfinite(x) else -9999.0
