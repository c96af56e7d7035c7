"""The scheduler in-process: continuous batching, cancellation, back-pressure; and config."""

from __future__ import annotations

import asyncio

import pytest

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
    assert all(ev.logprob is not None and len(ev.logprob[1]) == 3 for ev in events)


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
