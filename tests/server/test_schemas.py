"""The request models in-process: what each field becomes in the generation settings, and the
validators' messages. (The routes and their 400s run against real servers in test_validation.)"""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from sparsellm.server.schemas import (
    GREEDY_BELOW,
    MAX_STOP,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    PredictRequest,
    finite,
)


def error_messages(excinfo: pytest.ExceptionInfo[ValidationError]) -> list[tuple[str, str]]:
    return [(".".join(map(str, e["loc"])), e["msg"]) for e in excinfo.value.errors()]


@pytest.mark.parametrize("stop,want", [
    (None, None), ("a", ["a"]), (["a", "bc"], ["a", "bc"]), (["1", "2", "3", "4"],
                                                               ["1", "2", "3", "4"]),
])
def test_stop_becomes_a_list(stop, want):
    assert CompletionRequest(prompt="x", stop=stop).stop == want
    assert PredictRequest(sequences="x", stop=stop).stop == want


def test_stop_limits_name_the_limit_and_the_count():
    assert MAX_STOP == 4
    with pytest.raises(ValidationError) as info:
        CompletionRequest(prompt="x", stop=["a", "b", "c", "d", "e"])
    assert [m for _, m in error_messages(info)] == [
        "Value error, at most 4 stop strings are allowed, got 5"]
    for stop in ("", ["ok", ""]):
        with pytest.raises(ValidationError) as info:
            CompletionRequest(prompt="x", stop=stop)
        assert [m for _, m in error_messages(info)] == [
            "Value error, stop strings must not be empty"]


def test_predict_generation_kwargs_are_the_set_generation_fields():
    req = PredictRequest(sequences=["a", "b"], max_generated_tokens=5, seed=3, top_k=0,
                         session_id="s", return_logits=True, fixed_sequences_length=True,
                         stop="x", deterministic=False, sampling_temperature=0.5)
    assert req.generation_kwargs() == {"max_generated_tokens": 5, "seed": 3, "top_k": 0,
                                       "stop": ["x"], "deterministic": False,
                                       "sampling_temperature": 0.5}
    assert PredictRequest(sequences="a").generation_kwargs() == {}


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
def test_penalties_other_than_zero_are_refused(field):
    assert getattr(CompletionRequest(prompt="x", **{field: 0.0}), field) == 0.0
    assert getattr(CompletionRequest(prompt="x"), field) is None
    with pytest.raises(ValidationError) as info:
        CompletionRequest(prompt="x", **{field: 0.5})
    assert error_messages(info) == [
        (field, "Value error, is not supported (only 0); use repetition_penalty instead")]


@pytest.mark.parametrize("fields,want", [
    ({}, {}),
    ({"temperature": 0.0}, {"deterministic": True}),
    ({"temperature": GREEDY_BELOW / 2}, {"deterministic": True}),
    ({"temperature": GREEDY_BELOW}, {"deterministic": False,
                                     "sampling_temperature": GREEDY_BELOW}),
    ({"temperature": 0.7}, {"deterministic": False, "sampling_temperature": 0.7}),
    ({"temperature": 0.0, "top_p": 0.5}, {"deterministic": True, "top_p": 0.5}),
    # without a temperature, top_p < 1 or top_k > 0 asks for sampling
    ({"top_p": 0.9}, {"deterministic": False, "top_p": 0.9}),
    ({"top_p": 1.0}, {"top_p": 1.0}),
    ({"top_k": 5}, {"deterministic": False, "top_k": 5}),
    ({"top_k": 0}, {"top_k": 0}),
    ({"top_p": 1.0, "top_k": 3}, {"deterministic": False, "top_p": 1.0, "top_k": 3}),
    ({"repetition_penalty": 1.3, "seed": 7, "stop": "END"},
     {"repetition_penalty": 1.3, "seed": 7, "stop": ["END"]}),
    ({"seed": 0}, {"seed": 0}),
    ({"ignore_eos": True}, {"force_max_tokens": True}),
    ({"ignore_eos": False, "n": 2, "stream": True, "user": "u"}, {}),
])
def test_sampling_kwargs(fields, want):
    assert CompletionRequest(prompt="x", **fields).sampling_kwargs() == want
    assert ChatCompletionRequest(messages="hi", **fields).sampling_kwargs() == want


def test_chat_message_template_input():
    assert ChatMessage(role="user", content="hi").as_template_input() == {
        "role": "user", "content": "hi"}
    assert ChatMessage(role="developer", content="be brief").as_template_input() == {
        "role": "system", "content": "be brief"}
    assert ChatMessage(role="assistant", content=[{"type": "text", "text": "a"},
                                                  {"type": "text", "text": "bc"}]
                       ).as_template_input() == {"role": "assistant", "content": "abc"}
    assert ChatMessage(role="system", content=[]).as_template_input() == {
        "role": "system", "content": ""}


def test_finite_clamps_what_json_cannot_hold():
    assert finite(-1.5) == -1.5 and finite(0.0) == 0.0
    assert finite(-math.inf) == -9999.0
    assert finite(math.inf) == -9999.0 and finite(math.nan) == -9999.0
