"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Handlers only translate: OpenAI fields -> generation settings and requests, results and events
-> OpenAI's response and chunk shapes. Generation itself is the scheduler's.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import FastAPI, Request

from ..generation import GenerationRequest
from .errors import APIError
from .provider import ServedModel
from .scheduler import StreamEvent
from .schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    TokenLogprob,
    TopLogprob,
    Usage,
    _Sampling,
    finite,
)
from .state import OPENAI_FINISH, ServerState

# Each server-sent event: `data: <JSON chunk>` (or `data: [DONE]`).
STREAM_CONTENT = {"text/event-stream": {"schema": {
    "type": "object", "properties": {"data": {"type": "string"}}, "required": ["data"]}}}


def add_openai_routes(app: FastAPI, state: ServerState, responses: dict) -> None:
    stream_responses = {**responses, 200: {"content": STREAM_CONTENT,
                                           "description": "JSON, or server-sent events when "
                                                          "stream is true"}}

    @app.get("/v1/models", response_model=ModelList, responses=responses, tags=["openai"])
    async def list_models() -> ModelList:
        """The served endpoint names: what `model` selects."""
        created = {name: m.created for name, m in state.models.items()}
        return ModelList(data=[ModelCard(id=e.name, created=created.get(e.name, 0))
                               for e in state.endpoints])

    @app.post("/v1/completions", response_model=CompletionResponse, responses=stream_responses,
              tags=["openai"])
    async def completions(body: CompletionRequest, request: Request) -> Any:
        """Text completion for a prompt (or a list of prompts; text or token ids), `n` choices
        each. `echo` + `logprobs` also scores the prompt; `max_tokens: 0` only scores it."""
        served = _check_common(state, body)
        if body.max_tokens == 0 and not body.echo:
            raise APIError(400, "max_tokens must be at least 1; 0 is accepted with echo=true "
                           "(score the prompt without generating)", param="max_tokens")
        prompt_ids = _completion_prompts(state, served, body.prompt)
        tok = served.pipeline.tokenizer
        echoes = [_echo_text(tok, body.prompt, i, ids) for i, ids in enumerate(prompt_ids)] \
            if body.echo else [""] * len(prompt_ids)
        score = body.echo and body.logprobs is not None
        requests = _requests(state, served, body, prompt_ids, body.max_tokens, "prompt",
                             body.logprobs, score_prompt=score)
        submission = state.submit(served, requests)
        meta = _meta("cmpl", served)
        n_prompt = sum(len(ids) for ids in prompt_ids)

        def prompt_logprobs(i: int) -> CompletionLogprobs | None:
            """Choice i's echoed prompt tokens, scored (None unless echo and logprobs)."""
            if not score:
                return None
            r = submission.requests[i]
            entries = [(r.prompt_ids[0], None, None), *(
                (t, lp, top) for t, (lp, top) in
                zip(r.prompt_ids[1:], r.prompt_logprobs, strict=True))]
            return _completion_logprobs(tok, entries, 0)

        if not body.stream:
            results = await state.collect(request, served, submission)
            choices = []
            for i, r in enumerate(results):
                echo = echoes[i // body.n]
                lp = None
                if body.logprobs is not None:
                    lp = _join_logprobs(prompt_logprobs(i), _completion_logprobs(
                        tok, _logprob_entries(r), len(echo)))
                choices.append(CompletionChoice(
                    index=i, text=echo + r.text, finish_reason=_finish(r.finished_reason),
                    logprobs=lp))
            return CompletionResponse(**meta, choices=choices,
                                      usage=_usage(n_prompt, _completion_tokens(results)))

        counts = _StreamCounts(body, meta, "text_completion", len(requests), n_prompt)
        chunk = counts.chunk

        def on_event(i: int, ev: StreamEvent) -> list[dict[str, Any]]:
            text, lp = ev.text, None
            if counts.first(i) and body.echo:
                echo = echoes[i // body.n]
                counts.offset(i, echo)
                text = echo + text
                lp = prompt_logprobs(i)
            counts.add(ev)
            if ev.logprob is not None and ev.token_id is not None:
                lp = _join_logprobs(lp, _completion_logprobs(
                    tok, [(ev.token_id, *ev.logprob)], counts.offset(i, ev.text)))
            if not text and lp is None and ev.finished_reason is None:
                return []
            return [chunk([{"index": i, "text": text,
                            "logprobs": None if lp is None else lp.model_dump(),
                            "finish_reason": _finish(ev.finished_reason)}])]

        return state.stream(served, submission, on_event, counts.closing)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse,
              responses=stream_responses, tags=["openai"])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        """A chat reply: the messages go through the model's chat template."""
        served = _check_common(state, body)
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        messages = _chat_messages(body)
        prompt_ids = [state.encode(served, messages, "messages")]
        max_tokens = body.max_completion_tokens or body.max_tokens
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        requests = _requests(state, served, body, prompt_ids, max_tokens, "messages", logprobs)
        submission = state.submit(served, requests)
        tok = served.pipeline.tokenizer
        meta = _meta("chatcmpl", served)
        n_prompt = len(prompt_ids[0])
        if not body.stream:
            results = await state.collect(request, served, submission)
            choices = [ChatChoice(index=i, message=AssistantMessage(content=r.text),
                                  finish_reason=_finish(r.finished_reason),
                                  logprobs=_chat_logprobs(tok, _logprob_entries(r))
                                  if body.logprobs else None)
                       for i, r in enumerate(results)]
            return ChatCompletionResponse(**meta, choices=choices,
                                          usage=_usage(n_prompt, _completion_tokens(results)))

        counts = _StreamCounts(body, meta, "chat.completion.chunk", len(requests), n_prompt)
        chunk = counts.chunk

        def on_event(i: int, ev: StreamEvent) -> list[dict[str, Any]]:
            out = []
            if counts.first(i):
                out.append(chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                                   "logprobs": None, "finish_reason": None}]))
            counts.add(ev)
            lp = None
            if ev.logprob is not None and ev.token_id is not None:
                lp = _chat_logprobs(tok, [(ev.token_id, *ev.logprob)]).model_dump()
            if ev.text or lp is not None:
                out.append(chunk([{"index": i, "delta": {"content": ev.text}, "logprobs": lp,
                                   "finish_reason": None}]))
            if ev.finished_reason is not None:
                out.append(chunk([{"index": i, "delta": {}, "logprobs": None,
                                   "finish_reason": _finish(ev.finished_reason)}]))
            return out

        return state.stream(served, submission, on_event, counts.closing)


# ---- helpers -------------------------------------------------------------------------------------
def _check_common(state: ServerState, body: _Sampling) -> ServedModel:
    if body.n > state.config.max_n:
        raise APIError(400, f"n must be at most {state.config.max_n}, got {body.n}", param="n")
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options is only allowed with stream=true",
                       param="stream_options")
    return state.model(body.model)


def _chat_messages(body: ChatCompletionRequest) -> list[dict[str, str]]:
    """The conversation for the chat template: a string (`messages` or `prompt`) is one user
    message."""
    if body.messages is not None and body.prompt is not None:
        raise APIError(400, "send the conversation as `messages` or as `prompt`, not both",
                       param="prompt")
    if body.messages is None and body.prompt is None:
        raise APIError(400, "missing required field 'messages' (a list of chat messages, or "
                       "one string; `prompt` is accepted in its place)", param="messages")
    conversation = body.prompt if body.messages is None else body.messages
    if isinstance(conversation, str):
        return [{"role": "user", "content": conversation}]
    return [m.as_template_input() for m in conversation]


def _completion_prompts(state: ServerState, served: ServedModel,
                        prompt: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
    """Token ids of each prompt: strings are tokenized, token ids checked against the
    vocabulary."""
    if isinstance(prompt, str):
        return [state.encode(served, prompt, "prompt")]
    if isinstance(prompt[0], str):
        return [state.encode(served, p, "prompt") for p in prompt]
    prompts = [prompt] if isinstance(prompt[0], int) else prompt
    vocab = served.pipeline.engine.vocab_size
    for ids in prompts:
        bad = max(ids)
        if bad >= vocab:
            raise APIError(400, f"invalid 'prompt': token id {bad} is out of range; this "
                           f"model's token ids are 0 to {vocab - 1}", param="prompt")
    return [list(ids) for ids in prompts]


def _echo_text(tok: Any, prompt: Any, i: int, ids: list[int]) -> str:
    """The prompt as echoed: the string sent, or the decoded token ids."""
    if isinstance(prompt, str):
        return prompt
    return prompt[i] if isinstance(prompt[i], str) else tok.decode(ids)


def _requests(state: ServerState, served: ServedModel, body: _Sampling,
              prompt_ids: list[list[int]], max_tokens: int | None, param: str,
              logprobs: int | None, score_prompt: bool = False) -> list[GenerationRequest]:
    """n requests per prompt; choice j of a seeded request uses seed + j (distinct choices).
    max_tokens 0 makes requests that only score the prompt."""
    kwargs = body.sampling_kwargs()
    base = state.generation_config(served, **kwargs)
    requests = []
    for ids in prompt_ids:
        new_tokens = state.check_context(served, ids, max_tokens, param)
        for j in range(body.n):
            seed = None if base.seed is None else (base.seed + j) % 2**63
            # a scoring-only request samples nothing: its token budget is never used
            config = state.generation_config(served, **{**kwargs, "seed": seed},
                                             max_generated_tokens=max(new_tokens, 1))
            requests.append(GenerationRequest(ids, config, logprobs=logprobs,
                                              score_prompt=score_prompt,
                                              generate=new_tokens > 0))
    return requests


def _meta(prefix: str, served: ServedModel) -> dict[str, Any]:
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": served.name}


def _finish(reason: str | None) -> str | None:
    return None if reason is None else OPENAI_FINISH.get(reason, "stop")


def _usage(n_prompt: int, n_completion: int) -> Usage:
    return Usage(prompt_tokens=n_prompt, completion_tokens=n_completion,
                 total_tokens=n_prompt + n_completion)


def _completion_tokens(results: list[GenerationRequest]) -> int:
    return sum(len(r.output_ids) for r in results)


# (token id, its log-probability, {token id: log-probability} of the top ones); None for a
# prompt's first token, which nothing predicts
LogprobEntry = tuple[int, float | None, dict[int, float] | None]


def _logprob_entries(r: GenerationRequest) -> list[LogprobEntry]:
    return [(t, lp, top) for t, (lp, top) in zip(r.output_ids, r.token_logprobs, strict=True)]


class _StreamCounts:
    """One streamed response: its chunk framing (`meta`, the chunk object name, usage when
    stream_options asks) and per-choice bookkeeping (first event seen, tokens, text offsets)."""

    def __init__(self, body: Any, meta: dict[str, Any], object_name: str, n: int, n_prompt: int):
        self.meta, self.object_name, self.n_prompt = meta, object_name, n_prompt
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.seen = [False] * n
        self.text_len = [0] * n
        self.tokens = 0

    def chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        out = {**self.meta, "object": self.object_name, "choices": choices}
        return {**out, "usage": None} if self.include_usage else out

    def closing(self) -> list[dict[str, Any]]:
        """After the last event: a usage chunk, if asked for."""
        if not self.include_usage:
            return []
        return [self.chunk([]) | {"usage": _usage(self.n_prompt, self.tokens).model_dump()}]

    def first(self, i: int) -> bool:
        was = self.seen[i]
        self.seen[i] = True
        return not was

    def add(self, ev: StreamEvent) -> None:
        self.tokens += ev.token_id is not None

    def offset(self, i: int, text: str) -> int:
        start = self.text_len[i]
        self.text_len[i] += len(text)
        return start


def _token_text(tok: Any, token_id: int) -> str:
    return tok.decode([token_id])


def _completion_logprobs(tok: Any, entries: list[LogprobEntry], start: int
                         ) -> CompletionLogprobs:
    tokens, lps, tops, offsets = [], [], [], []
    offset = start
    for token_id, lp, top in entries:
        text = _token_text(tok, token_id)
        tokens.append(text)
        lps.append(None if lp is None else finite(lp))
        tops.append(None if top is None else _top_by_text(tok, top))
        offsets.append(offset)
        offset += len(text)
    return CompletionLogprobs(tokens=tokens, token_logprobs=lps, top_logprobs=tops,
                              text_offset=offsets)


def _top_by_text(tok: Any, top: dict[int, float]) -> dict[str, float]:
    """OpenAI's legacy top_logprobs are keyed by text: of two tokens with the same text (two
    byte tokens of one character), the more likely one is kept (`top` is best first)."""
    out: dict[str, float] = {}
    for t, v in top.items():
        out.setdefault(_token_text(tok, t), finite(v))
    return out


def _join_logprobs(first: CompletionLogprobs | None, second: CompletionLogprobs
                   ) -> CompletionLogprobs:
    """The prompt's entries (if any), then the generated tokens'."""
    if first is None:
        return second
    return CompletionLogprobs(tokens=first.tokens + second.tokens,
                              token_logprobs=first.token_logprobs + second.token_logprobs,
                              top_logprobs=first.top_logprobs + second.top_logprobs,
                              text_offset=first.text_offset + second.text_offset)


def _chat_logprobs(tok: Any, entries: list[LogprobEntry]) -> ChatLogprobs:
    content = []
    for token_id, lp, top in entries:
        text = _token_text(tok, token_id)
        content.append(TokenLogprob(
            token=text, logprob=finite(lp), bytes=list(text.encode()),
            top_logprobs=[TopLogprob(token=(t_text := _token_text(tok, t)), logprob=finite(v),
                                     bytes=list(t_text.encode())) for t, v in top.items()]))
    return ChatLogprobs(content=content)
