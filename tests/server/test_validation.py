"""Bad requests get HTTP 400 in OpenAI's error shape (never 422/500), against a real server."""

from __future__ import annotations

import socket

import pytest

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


def assert_error(r, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and "Traceback" not in err["message"]
    assert not any(leak in err["message"] for leak in ("/tmp", "/work", "site-packages", ".py"))
    if status == 400:
        assert err["type"] == "invalid_request_error"
    if code is not None:
        assert err["code"] == code
    if param is not None:
        assert err["param"] == param
    return err


@pytest.mark.parametrize("route,body,param", [
    (CHAT, {"messages": MSGS, "max_tokens": -1}, "max_tokens"),
    (CHAT, {"messages": MSGS, "max_tokens": 0}, "max_tokens"),
    (CHAT, {"messages": MSGS, "max_tokens": "abc"}, "max_tokens"),
    (CHAT, {"messages": MSGS, "max_tokens": 2.5}, "max_tokens"),
    (CHAT, {"messages": MSGS, "max_completion_tokens": 0}, "max_completion_tokens"),
    (CHAT, {"messages": MSGS, "temperature": -0.5}, "temperature"),
    (CHAT, {"messages": MSGS, "top_p": 0}, "top_p"),
    (CHAT, {"messages": MSGS, "top_p": 1.5}, "top_p"),
    (CHAT, {"messages": MSGS, "n": 0}, "n"),
    (CHAT, {"messages": MSGS, "n": 1000}, "n"),
    (CHAT, {"messages": MSGS, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    (CHAT, {"messages": MSGS, "stop": ""}, "stop"),
    (CHAT, {"messages": MSGS, "stop": ["ok", ""]}, "stop"),
    (CHAT, {"messages": MSGS, "unknown_field": 1}, "unknown_field"),
    (CHAT, {"messages": MSGS, "stream": "yes"}, "stream"),
    (CHAT, {"messages": MSGS, "presence_penalty": 0.5}, "presence_penalty"),
    (CHAT, {"messages": MSGS, "seed": -3}, "seed"),
    (CHAT, {"messages": MSGS, "top_logprobs": 2}, "top_logprobs"),
    (CHAT, {"messages": MSGS, "stream_options": {"include_usage": True}}, "stream_options"),
    (CHAT, {"messages": []}, "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, None),
    (CHAT, {"messages": [{"role": "user"}]}, None),
    (CHAT, {}, "messages"),
    (CHAT, {"model": None}, "messages"),
    (COMPLETIONS, {}, "prompt"),
    (COMPLETIONS, {"prompt": ""}, None),
    (COMPLETIONS, {"prompt": []}, "prompt"),
    (COMPLETIONS, {"prompt": "x", "logprobs": 6}, "logprobs"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    (COMPLETIONS, {"prompt": "x", "extra": {"a": 1}}, "extra"),
    ("/predict", {}, "sequences"),
    ("/predict", {"sequences": "x", "max_generated_tokens": 0}, "max_generated_tokens"),
    ("/predict", {"sequences": "x", "sampling_temperature": 0}, "sampling_temperature"),
    ("/predict", {"sequences": "x", "model_path": "/etc"}, "model_path"),
    ("/generate", {"sequences": 5}, None),
])
def test_invalid_fields_are_400(server, route, body, param):
    with server.client() as c:
        assert_error(c.post(route, json=body), 400, param=param)


@pytest.mark.parametrize("raw", [b'{"prompt": "x"', b"not json", b"[1, 2]", b'"text"', b"",
                                 b'{"prompt": "x", "temperature": NaN}',
                                 b'{"prompt": "x", "temperature": Infinity}'])
def test_malformed_bodies_are_400(server, raw):
    with server.client() as c:
        r = c.post(COMPLETIONS, content=raw, headers={"Content-Type": "application/json"})
        assert_error(r, 400)


def test_context_length_exceeded(server):
    with server.client() as c:
        err = assert_error(c.post(COMPLETIONS, json={"prompt": "hello", "max_tokens": 5000}),
                           400, code="context_length_exceeded")
        assert "2048" in err["message"] and "5000" in err["message"]
        long_prompt = "hello world " * 2000
        err = assert_error(c.post(CHAT, json={"messages": [{"role": "user",
                                                             "content": long_prompt}]}),
                           400, code="context_length_exceeded")
        assert "2048" in err["message"]


def test_unknown_model_is_404(server):
    with server.client() as c:
        assert_error(c.post(CHAT, json={"model": "../../etc/passwd", "messages": MSGS}), 404,
                     code="model_not_found", param="model")


def test_unknown_route_and_method_use_error_shape(server):
    with server.client() as c:
        assert_error(c.get("/nope"), 404)
        assert_error(c.get(COMPLETIONS), 405)


def read_reply(s: socket.socket) -> str:
    """An HTTP response read until its JSON body is complete (or the server closes)."""
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def test_oversized_body_with_content_length_is_413_before_reading(server):
    # Announce 50 MB but send nothing: the answer must come without the body being read.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: 50000000\r\n\r\n")
        reply = read_reply(s)
    assert reply.startswith("HTTP/1.1 413"), reply
    assert "invalid_request_error" in reply and "request_too_large" in reply


def test_oversized_chunked_body_is_413_while_receiving(server):
    chunk = b"x" * 65536
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        sent = 0
        try:
            for _ in range(64):  # up to 4 MiB; the limit is 1 MiB
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = read_reply(s)
    # The terminating chunk was never sent, so the 413 came before the body was complete.
    assert reply.startswith("HTTP/1.1 413"), reply
    assert sent > 1 << 20


def test_errors_are_counted_in_metrics(server):
    """The shared server has answered other 400s already: count the change this test makes."""
    key = 'sparsellm_errors_total{status="400"}'
    before = server.metrics().get(key, 0.0)
    with server.client() as c:
        for _ in range(3):
            assert_error(c.post(CHAT, json={"messages": MSGS, "n": 0}), 400, param="n")
    assert server.metrics()[key] - before == 3
