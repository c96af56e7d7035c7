"""Bounded load test on loopback: many concurrent streaming clients, zero errors, flat memory.

The 1-vs-8-client throughput ratio is printed, not asserted: speed is a benchmark's job
(`python -m sparsellm.server.loadtest`), and a timed assertion is flaky on a shared machine."""

from __future__ import annotations

import asyncio

import pytest

from sparsellm.server.loadtest import rss_mb, run_load

from .conftest import write_config


@pytest.mark.slow
def test_load_32_streaming_clients(start_server, tiny_llama_dir, tmp_path):
    config = write_config(tmp_path / "c.yaml", tiny_llama_dir, max_concurrent_requests=8,
                          max_queue=64, endpoints=[{
                              "model": str(tiny_llama_dir), "name": "tiny",
                              "kwargs": {"sequence_length": 256}}])
    srv = start_server(["--config-file", str(config)])
    asyncio.run(run_load(srv.url, 8, 32, max_tokens=16))  # warm up
    before = rss_mb(srv.proc.pid)
    result = asyncio.run(run_load(srv.url, 32, 320, max_tokens=32))
    after = rss_mb(srv.proc.pid)
    print(f"\nload: {result}; RSS {before:.0f} -> {after:.0f} MB")
    assert result.errors == 0, result.first_error
    assert result.tokens == 320 * 32
    assert result.requests_per_s == pytest.approx(320 / result.seconds)
    assert 0 < result.latency_p50 <= result.latency_p95 < result.seconds
    assert after - before < 50  # flat: no per-request leak

    single = asyncio.run(run_load(srv.url, 1, 24, max_tokens=64, stream=False))
    batched = asyncio.run(run_load(srv.url, 8, 24, max_tokens=64, stream=False))
    ratio = batched.tokens_per_s / single.tokens_per_s
    print(f"tokens/s: 1 client {single.tokens_per_s:.0f}, 8 clients "
          f"{batched.tokens_per_s:.0f} ({ratio:.2f}x)")
    assert single.errors == batched.errors == 0
    assert batched.tokens == single.tokens == 24 * 64
