"""Reliability and security against real server processes: disconnects, back-pressure, API key,
errors inside streams, SIGTERM drain."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from .conftest import API_KEY, metric, sse_events, write_config

openai = pytest.importorskip("openai")

MSGS = [{"role": "user", "content": "hi"}]
LONG = {"prompt": "def f(x):", "max_tokens": 1900, "temperature": 0, "ignore_eos": True,
        "stream": True}

# Runs the real CLI with test-only changes: a request whose stop strings include "FAULT"
# makes the engine step fail after a few tokens (an error after the stream started); one with
# "SLOW" takes 50 ms a token (it holds its batch slot for a known time).
FAULT_ENTRY = '''
import sys
import time
from sparsellm.generation import generator as g
_advance = g.BatchGenerator._advance
def advance(self, r, logits):
    if "FAULT" in r.config.stop and len(r.output_ids) >= 3:
        raise RuntimeError("injected failure in /secret/path/engine.py")
    if "SLOW" in r.config.stop:
        time.sleep(0.05)
    return _advance(self, r, logits)
g.BatchGenerator._advance = advance
from sparsellm.cli import main
sys.exit(main())
'''


@pytest.fixture(scope="module")
def guarded(start_server, tiny_llama_dir, tmp_path_factory):
    """API key, one batch slot and one queue place, fault injection."""
    tmp = tmp_path_factory.mktemp("guarded")
    entry = tmp / "entry.py"
    entry.write_text(FAULT_ENTRY)
    config = write_config(tmp / "config.yaml", tiny_llama_dir, max_concurrent_requests=1,
                          max_queue=1)
    return start_server(["--config-file", str(config), "--api-key", API_KEY],
                        entry=[sys.executable, str(entry)], api_key=API_KEY)


def wait_for(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_disconnect_cancels_generation(server):
    before = metric(server.metrics(), "sparsellm_client_disconnects_total")
    with httpx.Client(timeout=30) as c, c.stream("POST", server.url + "/v1/completions",
                                                   json=LONG) as r:
        events = sse_events(r.iter_lines())
        for _ in range(3):
            next(events)
    # The connection is closed now, with most of the 1900 tokens still to come.

    def idle() -> bool:
        m = server.metrics()
        return metric(m, "sparsellm_client_disconnects_total") > before and \
            metric(m, "sparsellm_active_requests.*") == 0 and \
            metric(m, "sparsellm_queue_depth.*") == 0

    assert wait_for(idle, 5)
    tokens = metric(server.metrics(), "sparsellm_generated_tokens_total.*")
    time.sleep(0.3)
    assert metric(server.metrics(), "sparsellm_generated_tokens_total.*") == tokens


def test_request_abandoned_while_waiting_is_499_not_500(guarded):
    """A non-streamed request whose client leaves while it waits for the batch slot ends in a
    499 (read by no one), not in a 500 from an answer built from a prompt never scored (found
    by the soak run, `python -m sparsellm.server.soak`)."""
    score = {"prompt": "import os\nimport sys\n", "max_tokens": 0, "echo": True, "logprobs": 1}
    closed = r'sparsellm_requests_total\{method="POST",route="/v1/completions",status="499"\}'
    failed = r'sparsellm_requests_total\{.*status="500"\}'
    before = guarded.metrics()
    unhandled = guarded.output().count("unhandled error")
    slow = {"prompt": "def f(x):", "max_tokens": 100, "ignore_eos": True, "stop": ["SLOW"],
            "stream": True}  # holds the one batch slot for ~5 s
    with guarded.client() as c, c.stream("POST", "/v1/completions", json=slow) as r:
        events = sse_events(r.iter_lines())  # (kept: closing it would close the stream)
        next(events)
        with pytest.raises(httpx.ReadTimeout):
            c.post("/v1/completions", json=score, timeout=1.0)  # waits in the queue, then leaves
    assert wait_for(lambda: metric(guarded.metrics(), closed) > metric(before, closed), 10)
    assert metric(guarded.metrics(), failed) == metric(before, failed)
    assert guarded.output().count("unhandled error") == unhandled


def test_api_key_required(guarded):
    url = guarded.url
    for path in ("/v1/models", "/metrics", "/docs", "/openapi.json"):
        r = httpx.get(url + path)
        assert r.status_code == 401, path
        assert r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(url + "/predict", json={"sequences": "x"},
                   headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert httpx.get(url + "/health").status_code == 200  # open for probes
    assert httpx.get(url + "/").status_code == 200  # the playground page (it asks for the key)
    assert httpx.get(url + "/v1/models", headers=guarded.headers).status_code == 200
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="tiny", messages=MSGS)
    good = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
    assert good.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2).choices


def test_over_capacity_is_429_at_once(guarded):
    """1 slot + 1 queue place: a third concurrent request is refused immediately."""
    client = openai.OpenAI(base_url=guarded.url + "/v1", api_key=API_KEY, max_retries=0)
    streams = []
    try:
        for _ in range(2):
            s = client.completions.create(model="tiny", prompt="x", max_tokens=1900,
                                          temperature=0, stream=True,
                                          extra_body={"ignore_eos": True})
            streams.append(s)
        next(iter(streams[0]))
        start = time.monotonic()
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model="tiny", prompt="x", max_tokens=2)
        assert time.monotonic() - start < 2
        assert e.value.response.headers["retry-after"]
        assert e.value.body["type"] == "rate_limit_error"
    finally:
        for s in streams:
            s.close()
    assert wait_for(lambda: httpx.post(guarded.url + "/v1/completions", headers=guarded.headers,
                                       json={"prompt": "x", "max_tokens": 2}).status_code == 200)


def test_error_after_stream_started(guarded):
    body = {"prompt": "x", "max_tokens": 50, "stop": ["FAULT"], "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", guarded.url + "/v1/completions", json=body,
                      headers=guarded.headers, timeout=30) as r:
        assert r.status_code == 200
        events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["type"] == "server_error" and "secret" not in error["message"]
    assert any("choices" in e for e in events[:-2])  # tokens came first
    # The server recovers: the next request works.
    r = httpx.post(guarded.url + "/v1/completions", headers=guarded.headers,
                   json={"prompt": "x", "max_tokens": 3}, timeout=30)
    assert r.status_code == 200, r.text


def test_sigterm_drains_then_exits_zero(start_server, tiny_llama_dir, tmp_path: Path):
    config = write_config(tmp_path / "config.yaml", tiny_llama_dir)
    srv = start_server(["--config-file", str(config)])
    result: dict = {}

    def stream() -> None:
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=60,
                          json=LONG) as r:
            result["events"] = list(sse_events(r.iter_lines()))

    t = threading.Thread(target=stream)
    t.start()
    assert wait_for(lambda: metric(srv.metrics(), "sparsellm_active_requests.*") == 1)
    srv.proc.send_signal(signal.SIGTERM)
    # Checked as soon as the signal is handled, while the long stream still drains (a fixed
    # sleep here let the stream finish and the server exit first on a fast run).
    assert wait_for(lambda: httpx.get(srv.url + "/health").status_code == 503, timeout=5)
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
    t.join(60)
    events = result["events"]
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert srv.proc.wait(30) == 0
