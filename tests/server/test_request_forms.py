"""The request forms DeepSparse users send, the fields they expect back, and clear errors for
what is wrong (issue 29), against the shared real server (tiny model named "tiny")."""

from __future__ import annotations

import numpy as np
import pytest

from sparsellm.cli import build_parser
from sparsellm.commands.serve import server_config

from .conftest import sse_events
from .test_validation import assert_error

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize("body", [
    {"messages": "Large language models are"},
    {"prompt": "Say this is a test"},
])
def test_chat_takes_a_string_as_one_user_message(server, body):
    as_list = {"messages": [{"role": "user", "content": next(iter(body.values()))}]}
    settings = {"max_tokens": 6, "temperature": 0}
    with server.client() as c:
        r = c.post(CHAT, json={**body, **settings})
        assert r.status_code == 200, r.text
        expected = c.post(CHAT, json={**as_list, **settings}).json()
        assert r.json()["choices"][0]["message"] == expected["choices"][0]["message"]
        assert r.json()["usage"] == expected["usage"]
        with c.stream("POST", CHAT, json={**body, **settings, "stream": True}) as s:
            events = list(sse_events(s.iter_lines()))
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == expected["choices"][0]["message"]["content"]


def test_chat_needs_messages_or_prompt_not_both(server):
    with server.client() as c:
        err = assert_error(c.post(CHAT, json={"messages": "a", "prompt": "b"}), 400,
                           param="prompt")
        assert "not both" in err["message"]
        err = assert_error(c.post(CHAT, json={"max_tokens": 3}), 400, param="messages")
        assert "messages" in err["message"] and "prompt" in err["message"]


@pytest.mark.parametrize("route", ["/predict", "/generate"])
def test_predict_returns_the_documented_fields(server, route):
    with server.client() as c:
        out = c.post(route, json={"sequences": "def fib(n):", "max_generated_tokens": 4}).json()
        assert out["sequences"] == [g["text"] for g in out["generations"]]
        assert len(out["sequences"]) == 1 and out["logits"] is None and out["session_id"]
        out = c.post(route, json={"sequences": ["def fib(n):", "import"], "session_id": "s1",
                                  "max_generated_tokens": 4, "force_max_tokens": True,
                                  "return_logits": True}).json()
    assert out["session_id"] == "s1" and len(out["sequences"]) == 2
    logits = np.asarray(out["logits"], dtype=np.float32)
    # (prompts, prompt + generated tokens of the longest, vocab), left-padded, finite
    assert logits.shape[0] == 2 and logits.shape[2] > 256 and np.isfinite(logits).all()
    assert (logits[1, 0] == 0).all() and (logits[0, 0] != 0).any()  # "import" is shorter


def test_predict_logits_match_the_pipeline(server, tiny_llama_dir):
    from sparsellm import Pipeline

    pipe = Pipeline.create(model_path=str(tiny_llama_dir), sequence_length=64, batch_size=1)
    expected = pipe("def fib(n):", max_generated_tokens=3, force_max_tokens=True,
                    return_logits=True)
    with server.client() as c:
        out = c.post("/predict", json={"sequences": "def fib(n):", "max_generated_tokens": 3,
                                       "force_max_tokens": True, "return_logits": True}).json()
    assert out["sequences"] == expected.sequences
    np.testing.assert_allclose(np.asarray(out["logits"]), expected.logits, rtol=1e-4, atol=1e-4)


def test_response_schema_is_documented(server):
    with server.client() as c:
        schemas = c.get("/openapi.json").json()["components"]["schemas"]
    assert {"sequences", "logits", "session_id"} <= set(schemas["PredictResponse"]["properties"])
    assert {"return_logits", "fixed_sequences_length"} <= set(
        schemas["PredictRequest"]["properties"])


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
@pytest.mark.parametrize("route", ["/predict", "/v1/completions", CHAT])
def test_wrong_content_type_is_415(server, route, content_type):
    with server.client() as c:
        r = c.post(route, content=b'{"sequences": "x", "prompt": "x"}',
                   headers={"Content-Type": content_type})
    err = assert_error(r, 415, code="unsupported_media_type")
    assert content_type.split(";")[0] in err["message"]
    assert "Content-Type: application/json" in err["message"]


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8",
                                          "Application/JSON", None])
def test_json_content_types_are_accepted(server, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    with server.client() as c:
        r = c.post("/predict", content=b'{"sequences": "x", "max_generated_tokens": 2}',
                   headers=headers)
    assert r.status_code == 200, r.text


def test_oversize_stop_list_names_the_limit_and_the_count(server):
    with server.client() as c:
        for route, body in [(CHAT, {"messages": "hi"}), ("/predict", {"sequences": "hi"})]:
            err = assert_error(c.post(route, json={**body, "stop": list("abcde")}), 400,
                               param="stop")
            assert err["message"] == "invalid 'stop': at most 4 stop strings are allowed, got 5"
        err = assert_error(c.post(CHAT, json={"messages": "hi", "stop": 7}), 400, param="stop")
        assert err["message"] == "invalid 'stop': expected a list or a string"


def test_unknown_model_is_404_listing_the_served_ids(server):
    with server.client() as c:
        err = assert_error(c.post(CHAT, json={"model": "gpt-4", "messages": "hi"}), 404,
                           code="model_not_found", param="model")
    assert err["message"] == ("model 'gpt-4' is not served here; served models (the ids of "
                              "/v1/models): 'tiny'")


def parse(*argv: str):
    return server_config(build_parser().parse_args(["serve", *argv]))


def test_served_id_is_the_model_as_given():
    config = parse("--integration", "openai", "./models/pruned50/")
    [endpoint] = config.endpoints
    assert (endpoint.model, endpoint.name, config.integration) == (
        "./models/pruned50/", "./models/pruned50/", "openai")
    assert parse("--model_path", "hf:org/model").endpoints[0].name == "hf:org/model"
    assert parse().endpoints[0].name == "smollm2-135m-instruct"
    named = parse("./m.gguf", "--served-model-name", "pruned").endpoints[0]
    assert (named.model, named.name) == ("./m.gguf", "pruned")


def test_serve_model_errors(tmp_path):
    with pytest.raises(ValueError, match="two models given"):
        parse("./a", "--model_path", "./b")
    config = tmp_path / "config.yaml"
    config.write_text("endpoints: [{model: ./a}]\n")
    with pytest.raises(ValueError, match="--served-model-name go with a model"):
        parse("--config-file", str(config), "--served-model-name", "x")
    assert parse("--config-file", str(config)).endpoints[0].name == "./a"
