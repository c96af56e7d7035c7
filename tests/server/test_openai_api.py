"""The official `openai` package, unmodified, against a real server; and /predict."""

from __future__ import annotations

import httpx
import pytest

openai = pytest.importorskip("openai")

from .conftest import sse_events  # noqa: E402

MSGS = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_models(client):
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_completion(client):
    out = client.completions.create(
        model="tiny", prompt="def fib(n):", max_tokens=8,
                                    temperature=0, extra_body={"ignore_eos": True})
    choice = out.choices[0]
    assert out.object == "text_completion" and out.model == "tiny"
    assert choice.finish_reason == "length" and choice.text
    assert out.usage.completion_tokens == 8 and out.usage.prompt_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + 8
    again = client.completions.create(
        model="tiny", prompt="def fib(n):", max_tokens=8,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert again.choices[0].text == choice.text  # greedy is deterministic


def test_completion_stream_matches_non_stream(client):
    full = client.completions.create(
        model="tiny", prompt="import os", max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True})
    chunks = list(client.completions.create(
        model="tiny", prompt="import os", max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices


def test_completion_n_prompts_seed_logprobs(client):
    out = client.completions.create(
        model="tiny", prompt=["a", "b"], n=2, max_tokens=5, temperature=1.0,
                                    seed=7, logprobs=2, extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    for c in out.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
        assert all(x <= 0 for x in lp.token_logprobs)
        assert all(1 <= len(t) <= 2 for t in lp.top_logprobs)
    assert out.usage.completion_tokens == 20
    again = client.completions.create(
        model="tiny", prompt=["a", "b"], n=2, max_tokens=5, temperature=1.0,
                                      seed=7, logprobs=2, extra_body={"ignore_eos": True})
    assert [c.text for c in again.choices] == [c.text for c in out.choices]


def test_chat(client):
    out = client.chat.completions.create(
        model="tiny", messages=MSGS, max_completion_tokens=6,
                                         temperature=0, logprobs=True, top_logprobs=3)
    choice = out.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert len(choice.logprobs.content) == out.usage.completion_tokens <= 6
    assert len(choice.logprobs.content[0].top_logprobs) == 3


def test_chat_stream(client):
    full = client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=10, temperature=0)
    stream = client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_chat_stop_string(client):
    base = client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=20, temperature=0,
                                          extra_body={"ignore_eos": True})
    text = base.choices[0].message.content
    stop = text[5:8]
    if not stop.strip():
        pytest.skip("generated text has no usable stop string")
    out = client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=20, temperature=0,
                                         stop=[stop], extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].message.content == text[:text.index(stop)]


def test_openai_errors(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=0)
    assert e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
        model="tiny", prompt="x", max_tokens=100000)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4", messages=MSGS)
    assert e.value.code == "model_not_found"


def test_predict_matches_pipeline(server, tiny_llama_dir):
    from sparsellm import TextGeneration

    pipeline = TextGeneration(tiny_llama_dir, sequence_length=2048, max_generated_tokens=16)
    expected = pipeline(sequences=["def fib(n):", "hello"])
    for route in ("/predict", "/generate"):
        r = httpx.post(server.url + route, json={"sequences": ["def fib(n):", "hello"]},
                       timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["prompts"] == ["def fib(n):", "hello"]
        assert [g["text"] for g in body["generations"]] == expected.sequences
        assert [g["finished_reason"] for g in body["generations"]] == \
            [g.finished_reason for g in expected.generations]
        assert body["session_id"] and body["created"] > 0


def test_predict_settings(server):
    r = httpx.post(server.url + "/predict", json={
        "sequences": "x", "max_generated_tokens": 5, "force_max_tokens": True,
        "deterministic": False, "sampling_temperature": 0.7, "top_k": 10, "top_p": 0.9,
        "repetition_penalty": 1.1, "seed": 3, "session_id": "abc"}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["session_id"] == "abc"
    assert body["generations"][0]["finished_reason"] == "length"


def test_concurrent_requests_match_sequential(server):
    """Continuous batching must not change greedy outputs."""
    import concurrent.futures

    prompts = [f"def f{i}(x):" for i in range(6)]

    def run(p: str) -> str:
        r = httpx.post(server.url + "/v1/completions", timeout=60, json={
            "prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
        return r.json()["choices"][0]["text"]

    sequential = [run(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        concurrent_ = list(pool.map(run, prompts))
    assert concurrent_ == sequential


def test_raw_stream_format(server):
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=30, json={
            "messages": MSGS, "max_tokens": 3, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")


def test_health_docs_and_playground(server):
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert httpx.get(server.url + "/docs").status_code == 200
    spec = httpx.get(server.url + "/openapi.json").json()
    assert {"/predict", "/generate", "/v1/completions", "/v1/chat/completions",
            "/v1/models"} <= set(spec["paths"])
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and "sparsellm playground" in page.text


def test_command_line_engine_settings(start_server, tiny_llama_dir):
    """`serve --model_path` takes generate's engine flags (here converted weights, an int8 KV
    cache and two batch slots) and serves what a pipeline with the same settings generates."""
    from sparsellm import TextGeneration

    settings = ["--sequence-length", "256", "--weights", "int8_a8", "--kv-cache-dtype", "int8"]
    srv = start_server(["--model_path", str(tiny_llama_dir), "--max-concurrent-requests", "2",
                        *settings])
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    [model] = [m.id for m in client.models.list()]
    out = client.completions.create(model=model, prompt="def fib(n):", max_tokens=8,
                                    temperature=0, extra_body={"ignore_eos": True})
    pipeline = TextGeneration(tiny_llama_dir, sequence_length=256, weights="int8_a8",
                              kv_cache_dtype="int8", max_generated_tokens=8,
                              force_max_tokens=True)
    assert out.choices[0].text == pipeline("def fib(n):").sequences[0]

