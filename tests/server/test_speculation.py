"""Speculative decoding in the server: a batch of concurrent requests, each verifying its own
drafted tokens in the batched step, answers exactly as the plain server does (the OpenAI
responses are unchanged), and /metrics counts drafted and accepted tokens."""

from __future__ import annotations

import concurrent.futures

import pytest

openai = pytest.importorskip("openai")

from .conftest import metric  # noqa: E402

PROMPTS = ["def fib(n):", "import os", "class A:", "for i in range(10):", "x = [1, 2, 3]",
           "# a comment", "print(", "return"]


def complete(server, prompt: str, stream: bool = False) -> tuple[str, str, list[float] | None]:
    """(text, finish reason, token log-probabilities) of a greedy completion."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    args = dict(model="tiny", prompt=prompt, max_tokens=24, temperature=0, logprobs=2,
                extra_body={"ignore_eos": True})
    if stream:
        chunks = [c for c in client.completions.create(stream=True, **args) if c.choices]
        return ("".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason,
                [lp for c in chunks for lp in c.choices[0].logprobs.token_logprobs])
    out = client.completions.create(**args).choices[0]
    return out.text, out.finish_reason, out.logprobs.token_logprobs


@pytest.fixture(scope="module")
def speculative_server(start_server, tiny_llama_dir):
    """The tiny model drafting for itself through prompt lookup, then the same model as the
    draft, 4 tokens every step (not adaptive, so every step speculates)."""
    return start_server([str(tiny_llama_dir), "--served-model-name", "tiny",
                         "--max-concurrent-requests", "4", "--sequence-length", "2048",
                         "--draft-model", str(tiny_llama_dir), "--prompt-lookup",
                         "--num-speculative-tokens", "4", "--no-adaptive-speculation"])


def test_concurrent_speculative_requests_match_the_plain_server(server, speculative_server):
    plain = [complete(server, p) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        spec = list(pool.map(lambda p: complete(speculative_server, p), PROMPTS))
        streamed = list(pool.map(lambda p: complete(speculative_server, p, True), PROMPTS))
    for (text, reason, logprobs), (s_text, s_reason, s_logprobs), (t_text, t_reason, t_lp) in \
            zip(plain, spec, streamed, strict=True):
        assert s_text == t_text == text and s_reason == t_reason == reason == "length"
        # verification rows come from multi-token steps: the same math up to rounding
        assert s_logprobs == pytest.approx(logprobs, abs=1e-4)
        assert t_lp == pytest.approx(logprobs, abs=1e-4)


def test_metrics_count_drafted_and_accepted_tokens(speculative_server):
    before = speculative_server.metrics()
    complete(speculative_server, "def add(a, b):")
    m = speculative_server.metrics()
    label = '{model="tiny"}'
    steps = m[f"sparsellm_speculative_verifications_total{label}"] - \
        before.get(f"sparsellm_speculative_verifications_total{label}", 0)
    drafted = m[f"sparsellm_speculative_draft_tokens_total{label}"] - \
        before.get(f"sparsellm_speculative_draft_tokens_total{label}", 0)
    accepted = m[f"sparsellm_speculative_accepted_tokens_total{label}"] - \
        before.get(f"sparsellm_speculative_accepted_tokens_total{label}", 0)
    # 24 tokens: the first comes from the prefill, the other 23 from steps that each verify up
    # to 4 drafted tokens and add the model's own (the last step may have no room to draft)
    assert 0 < drafted <= 4 * steps and 22 <= steps + accepted <= 23
    # the draft is the model itself: nearly everything it proposes is accepted
    assert accepted >= 0.8 * drafted
    totals = (m[f"sparsellm_speculative_accepted_tokens_total{label}"],
              m[f"sparsellm_speculative_draft_tokens_total{label}"],
              m[f"sparsellm_speculative_verifications_total{label}"])
    assert m[f"sparsellm_speculative_acceptance_rate{label}"] == \
        pytest.approx(totals[0] / totals[1], abs=1e-6)
    assert m[f"sparsellm_speculative_tokens_per_verification{label}"] == \
        pytest.approx((totals[0] + totals[2]) / totals[2], abs=1e-6)


def test_plain_server_has_no_speculation_metrics(server):
    assert metric(server.metrics(), "sparsellm_speculative_.*") == 0
    assert not [k for k in server.metrics() if k.startswith("sparsellm_speculative_")]
