"""/v1/completions as lm-evaluation-harness uses it (issue 31): prompts as token ids, `echo` +
`logprobs` scoring the prompt in OpenAI's legacy shape, `max_tokens: 0` to score only; against
the shared real server (tiny random Llama), checked against transformers and the perplexity
integration's own scoring."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from .conftest import sse_events
from .test_validation import assert_error

COMPLETIONS = "/v1/completions"
TEXT = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"


@pytest.fixture(scope="module")
def tok(tiny_llama_dir):
    from sparsellm.tokenizer import Tokenizer

    return Tokenizer.from_files(tiny_llama_dir)


def post(server, body: dict) -> dict:
    with server.client() as c:
        r = c.post(COMPLETIONS, json={"temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def score(server, prompt, max_tokens: int = 0, logprobs: int = 1) -> dict:
    return post(server, {"prompt": prompt, "max_tokens": max_tokens, "echo": True,
                         "logprobs": logprobs})


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_token_id_prompts_generate_as_the_text(server, tok):
    ids = tok.encode("import os\n")
    text = post(server, {"prompt": "import os\n", "max_tokens": 8})
    as_ids = post(server, {"prompt": ids, "max_tokens": 8})
    assert as_ids["choices"][0]["text"] == text["choices"][0]["text"]
    assert as_ids["usage"]["prompt_tokens"] == len(ids) == text["usage"]["prompt_tokens"]
    other = tok.encode("class Point:")
    both = post(server, {"prompt": [ids, other], "max_tokens": 8})
    alone = post(server, {"prompt": other, "max_tokens": 8})
    assert [c["index"] for c in both["choices"]] == [0, 1]
    assert [c["text"] for c in both["choices"]] == [text["choices"][0]["text"],
                                                    alone["choices"][0]["text"]]
    assert both["usage"]["prompt_tokens"] == len(ids) + len(other)


def test_echo_logprobs_legacy_shape_and_values(server, tok, tiny_llama_dir, hf_model,
                                               hf_logits_fn):
    ids = tok.encode(TEXT)
    out = score(server, TEXT, max_tokens=3, logprobs=2)
    choice = out["choices"][0]
    lp = choice["logprobs"]
    n = len(ids)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == \
        len(lp["text_offset"]) == n + 3
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["tokens"][:n] == [tok.decode([t]) for t in ids]
    assert choice["text"].startswith(TEXT) and choice["finish_reason"] == "length"
    assert lp["text_offset"][0] == 0 and lp["text_offset"][n] == len(TEXT)
    assert all(b - a == len(t) for a, b, t in zip(lp["text_offset"], lp["text_offset"][1:],
                                                  lp["tokens"], strict=False))
    # two entries, unless both top tokens decode to the same text (a dict key in OpenAI's shape)
    assert all(1 <= len(top) <= 2 for top in lp["top_logprobs"][1:])
    assert sum(len(top) == 2 for top in lp["top_logprobs"][1:]) > n // 2
    # prompt tokens 1..n-1 against transformers' fp32 logits
    ref = log_softmax(hf_logits_fn(hf_model(tiny_llama_dir), ids))
    want = ref[np.arange(n - 1), ids[1:]]
    np.testing.assert_allclose(lp["token_logprobs"][1:n], want, atol=1e-4)
    for row, top in zip(ref[:n - 1], lp["top_logprobs"][1:n], strict=True):
        best = np.sort(row)[::-1][:2]
        assert max(top.values()) == pytest.approx(best[0], abs=1e-4)
        assert all(min(abs(best - v)) < 1e-4 for v in top.values())
    # the generated tokens follow, greedy: each one is its own top entry
    for t, top in zip(lp["token_logprobs"][n:], lp["top_logprobs"][n:], strict=True):
        assert t == pytest.approx(max(top.values()))


def test_prompt_logprobs_equal_the_perplexity_integration(server, tok, tiny_llama_dir):
    """Per token, to 1e-4: the NLL the perplexity integration adds up for each prefix."""
    from sparsellm.engine import Engine
    from sparsellm.evaluation import evaluate, score_token_ids

    ids = tok.encode(TEXT)
    got = score(server, ids)["choices"][0]["logprobs"]["token_logprobs"]
    assert len(got) == len(ids) and got[0] is None
    engine = Engine(str(tiny_llama_dir), sequence_length=256, max_sequences=4)
    cumulative = [score_token_ids(engine, [ids[:k]], 256, 128).nll for k in range(2, len(ids) + 1)]
    per_token = -np.diff([0.0, *cumulative])
    np.testing.assert_allclose(got[1:], per_token, atol=1e-4)
    result = evaluate(tiny_llama_dir, datasets=[{"text": TEXT}], integration="perplexity")
    assert result.tokens == len(ids) - 1
    assert -sum(got[1:]) == pytest.approx(result.nll, abs=1e-4 * len(ids))


def test_max_tokens_0_scores_without_generating(server, tok):
    ids = tok.encode(TEXT)
    only = score(server, ids, max_tokens=0)
    plus_one = score(server, ids, max_tokens=1)
    c = only["choices"][0]
    assert c["text"] == tok.decode(ids) and c["finish_reason"] == "length"
    assert only["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0,
                             "total_tokens": len(ids)}
    lp, lp1 = c["logprobs"], plus_one["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(ids) and len(lp1["tokens"]) == len(ids) + 1
    np.testing.assert_allclose(lp["token_logprobs"][1:], lp1["token_logprobs"][1:len(ids)],
                               atol=1e-5)
    assert lp["tokens"] == lp1["tokens"][:-1]
    one_token = score(server, ids[:1])["choices"][0]["logprobs"]
    assert one_token["token_logprobs"] == [None] and one_token["top_logprobs"] == [None]


def test_echo_without_logprobs_and_logprobs_without_echo(server, tok):
    echo = post(server, {"prompt": "import os", "max_tokens": 0, "echo": True})
    assert echo["choices"][0]["text"] == "import os" and echo["choices"][0]["logprobs"] is None
    gen = post(server, {"prompt": "import os", "max_tokens": 2, "logprobs": 1})
    lp = gen["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 2 and None not in lp["token_logprobs"]  # no prompt entries


def test_streamed_scoring_matches(server, tok):
    ids = tok.encode(TEXT)
    full = score(server, ids, max_tokens=2)["choices"][0]
    with server.client() as c, c.stream("POST", COMPLETIONS, json={
            "prompt": ids, "max_tokens": 2, "echo": True, "logprobs": 1, "temperature": 0,
            "stream": True}) as r:
        assert r.status_code == 200
        events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = [e["choices"][0] for e in events[:-1] if e["choices"]]
    assert "".join(ch["text"] for ch in chunks) == full["text"]
    merged = {k: [v for ch in chunks if ch["logprobs"] for v in ch["logprobs"][k]]
              for k in ("tokens", "token_logprobs", "text_offset")}
    assert merged["tokens"] == full["logprobs"]["tokens"]
    assert merged["text_offset"] == full["logprobs"]["text_offset"]
    assert merged["token_logprobs"][0] is None
    np.testing.assert_allclose(merged["token_logprobs"][1:],
                               full["logprobs"]["token_logprobs"][1:], atol=1e-5)


def test_scoring_batched_with_other_requests_gives_the_same_numbers(server, tok):
    """Scoring requests admitted while others generate (one scheduler, shared steps) score as
    when alone."""
    prompts = [tok.encode(t) for t in (TEXT, "import os\nimport sys\n", "class Point:\n",
                                       "The quick brown fox")]
    alone = [score(server, p)["choices"][0]["logprobs"]["token_logprobs"] for p in prompts]

    async def together() -> list[dict]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            gen = c.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 40,
                                            "ignore_eos": True})
            scores = [c.post(COMPLETIONS, json={"prompt": p, "max_tokens": 0, "echo": True,
                                                "logprobs": 1}) for p in prompts]
            batch = c.post(COMPLETIONS, json={"prompt": prompts, "max_tokens": 0, "echo": True,
                                              "logprobs": 1})
            return [r.json() for r in await asyncio.gather(gen, *scores, batch)]

    results = asyncio.run(together())
    assert results[0]["usage"]["completion_tokens"] == 40
    concurrent = [r["choices"][0]["logprobs"]["token_logprobs"] for r in results[1:-1]]
    batched = [c["logprobs"]["token_logprobs"] for c in results[-1]["choices"]]
    for want, *gots in zip(alone, concurrent, batched, strict=True):
        for got in gots:
            assert got[0] is None and len(got) == len(want)
            np.testing.assert_allclose(got[1:], want[1:], atol=1e-5)


@pytest.mark.parametrize("body, param", [
    ({"prompt": [1, 2, 10**6]}, "prompt"),  # beyond the vocabulary
    ({"prompt": [[5, 6], [7, 400]]}, "prompt"),  # the tiny vocabulary has 400 tokens
    ({"prompt": [5, -1]}, None),
    ({"prompt": [[5, 6], []]}, None),
    ({"prompt": [[]]}, None),
    ({"prompt": [5, "a"]}, None),
    ({"prompt": [[5], "a"]}, None),
    ({"prompt": [5.5]}, None),
    ({"prompt": [True]}, None),
    ({"prompt": [[5]] * 65}, "prompt"),  # more prompts than MAX_PROMPTS
    ({"prompt": [5, 6], "max_tokens": 0}, "max_tokens"),  # 0 needs echo
    ({"prompt": "x", "max_tokens": -1, "echo": True}, "max_tokens"),
])
def test_bad_token_prompts_are_400(server, body, param):
    with server.client() as c:
        assert_error(c.post(COMPLETIONS, json=body), 400, param=param)


def test_scoring_takes_the_whole_context_and_no_more(server):
    """max_tokens 0 scores a prompt of sequence_length (2048) tokens; one more is refused, as
    is generating after a full context."""
    full = score(server, [5] * 2048)["choices"][0]["logprobs"]["token_logprobs"]
    assert len(full) == 2048 and all(v is not None for v in full[1:])
    with server.client() as c:
        r = c.post(COMPLETIONS, json={"prompt": [5] * 2049, "max_tokens": 0, "echo": True,
                                      "logprobs": 1})
        assert_error(r, 400, code="context_length_exceeded", param="prompt")
        r = c.post(COMPLETIONS, json={"prompt": [5] * 2048, "max_tokens": 1, "echo": True})
        assert_error(r, 400, code="context_length_exceeded", param="prompt")
