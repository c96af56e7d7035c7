"""The scheduler in-process: continuous batching, cancellation, back-pressure; and config."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from sparsellm.generation import GenerationRequest
from sparsellm.server.config import ServerConfig
from sparsellm.server.scheduler import QueueFull, Scheduler


@pytest.fixture(scope="module")
def pipeline(tiny_llama_dir):
    from sparsellm import TextGeneration

    return TextGeneration(tiny_llama_dir, sequence_length=256, batch_size=2,
                          max_generated_tokens=20, force_max_tokens=True)


def run(coro):
    return asyncio.run(coro)


def test_requests_join_and_leave_between_steps(pipeline):
    expected = pipeline(sequences=["a", "bb", "ccc"]).sequences  # 2 slots: one waits

    async def main():
        sched = Scheduler(pipeline.generator, "tiny", max_queue=4)
        sched.start()
        try:
            reqs = [pipeline.request(p, pipeline.config_for()) for p in ("a", "bb", "ccc")]
            subs = [sched.submit([r]) for r in reqs]
            texts = []
            for sub in subs:
                text = ""
                async for _, ev in sub.events():
                    text += ev.text
                texts.append(text)
            return texts, sched.counts()
        finally:
            sched.stop()

    texts, counts = run(main())
    assert texts == expected
    assert counts == (0, 0)


def test_cancel_frees_the_slot(pipeline):
    async def main():
        sched = Scheduler(pipeline.generator, "tiny", max_queue=0)
        sched.start()
        try:
            cfg = pipeline.config_for(max_generated_tokens=200)
            sub = sched.submit([pipeline.request("x", cfg), pipeline.request("y", cfg)])
            with pytest.raises(QueueFull):  # 2 slots + 0 queue places
                sched.submit([pipeline.request("z", cfg)])
            async for _ in sub.events():
                break
            sched.cancel(sub)
            for _ in range(100):
                if sched.inflight == 0 and sched.counts() == (0, 0):
                    break
                await asyncio.sleep(0.01)
            assert sched.inflight == 0 and sched.counts() == (0, 0)
            assert all(r.finished_reason == "cancelled" for r in sub.requests)
            sub2 = sched.submit([pipeline.request("z", pipeline.config_for())])
            return [ev async for _, ev in sub2.events()]
        finally:
            sched.stop()

    events = run(main())
    assert events[-1].finished_reason == "length" and len(events) == 20


def test_logprobs_are_delivered(pipeline):
    async def main():
        sched = Scheduler(pipeline.generator, "tiny", max_queue=2)
        sched.start()
        try:
            r = GenerationRequest(pipeline.encode_prompt("x"), pipeline.config_for(
                max_generated_tokens=4), logprobs=3)
            return [ev async for _, ev in sched.submit([r]).events()]
        finally:
            sched.stop()

    events = run(main())
    assert len(events) == 4
    # The values: log-softmax of the logits each token was chosen from (transformers' own
    # log_softmax, in float64), the chosen token's and the 3 best, best first.
    out = pipeline(sequences="x", max_generated_tokens=4, return_logits=True)
    tokens = out.generations[0].token_ids
    assert [ev.token_id for ev in events] == tokens
    rows = out.logits[0, -5:-1].astype(np.float64)  # the rows the 4 tokens came from
    logp = torch.log_softmax(torch.from_numpy(rows), -1).numpy()
    for ev, row, token in zip(events, logp, tokens, strict=True):
        chosen, top = ev.logprob
        assert chosen == pytest.approx(row[token], abs=1e-5)
        best = np.argsort(-row)[:3]
        assert list(top) == best.tolist()
        np.testing.assert_allclose(list(top.values()), row[best], atol=1e-5, rtol=0)
        assert chosen == pytest.approx(max(top.values()), abs=1e-9)  # greedy: the best token


def test_config_file_validation(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("endpoints:\n  - task: text-generation\n    model: ./m\n    route: /generate\n"
                   "    kwargs: {sequence_length: 256, max_generated_tokens: 32, "
                   "force_max_tokens: true, deterministic: false}\n")
    config = ServerConfig.load(cfg, port=1234)
    assert config.endpoints[0].name == "./m" and config.port == 1234  # the id: model as given
    cfg.write_text("endpoints:\n  - model: ./m\n    kwargs: {bogus: 1}\n")
    with pytest.raises(ValueError, match="bogus"):
        ServerConfig.load(cfg)
    cfg.write_text("endpoints:\n  - model: ./m\n    route: /v1/completions\n")
    with pytest.raises(ValueError, match="route"):
        ServerConfig.load(cfg)
    cfg.write_text("endpoints:\n  - model: ./m\n    kwargs: {max_generated_tokens: 0}\n")
    with pytest.raises(ValueError, match="max_generated_tokens"):
        ServerConfig.load(cfg)
