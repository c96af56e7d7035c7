"""A bounded load test for a running server (loopback only by default).

    python -m sparsellm.server.loadtest --url http://127.0.0.1:5543 --clients 32 --requests 300
    python -m sparsellm.server.loadtest --url ... --scaling 1,8 --requests 48   # tokens/s vs 1

Every request is a completion with `ignore_eos`, so each one generates exactly --max-tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np


@dataclass
class LoadResult:
    clients: int
    requests: int
    errors: int
    tokens: int
    seconds: float
    tokens_per_s: float
    requests_per_s: float  # requests answered without error per second
    latency_p50: float  # seconds from sending a request to its last byte, over the answered
    latency_p95: float
    first_error: str | None = None


def free_port() -> int:
    """A loopback port free now, for a server about to be started."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout: float = 300,
                 log_path: Path | None = None) -> None:
    """Returns once GET url/health answers 200 (a server started as proc, if given). Raises
    RuntimeError if proc exits first, TimeoutError after timeout seconds; both end with the
    tail of the server's log_path, if given."""
    def log_tail() -> str:
        return f"; its log:\n{log_path.read_text()[-3000:]}" if log_path else ""

    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with status {proc.returncode}{log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not healthy after {timeout:.0f} s{log_tail()}")
        time.sleep(0.2)


async def run_load(url: str, clients: int, requests: int, max_tokens: int = 32,
                   stream: bool = True, api_key: str | None = None,
                   timeout: float = 120.0) -> LoadResult:
    """`requests` completions from `clients` concurrent connections; counts errors and tokens."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"prompt": "def fibonacci(n):", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    todo = iter(range(requests))
    stats = {"errors": 0, "tokens": 0, "first_error": None}
    latencies: list[float] = []

    def error(message: str) -> None:
        stats["errors"] += 1
        stats["first_error"] = stats["first_error"] or message

    async def one(client: httpx.AsyncClient) -> None:
        if not stream:
            r = await client.post("/v1/completions", json=body)
            if r.status_code != 200:
                return error(f"{r.status_code}: {r.text[:200]}")
            stats["tokens"] += r.json()["usage"]["completion_tokens"]
            return None
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return error(f"{r.status_code}: {(await r.aread())[:200]!r}")
            done = False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    return error(event["error"]["message"])
                if event.get("usage"):
                    stats["tokens"] += event["usage"]["completion_tokens"]
            if not done:
                error("stream ended without [DONE]")
        return None

    async def worker() -> None:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout) as client:
            for _ in todo:
                sent, errors = time.perf_counter(), stats["errors"]
                try:
                    await one(client)
                except httpx.HTTPError as e:
                    error(f"{type(e).__name__}: {e}")
                if stats["errors"] == errors:
                    latencies.append(time.perf_counter() - sent)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    seconds = time.perf_counter() - start
    p50, p95 = np.percentile(latencies, [50, 95]) if latencies else (float("nan"),) * 2
    return LoadResult(clients, requests, stats["errors"], stats["tokens"], seconds,
                      stats["tokens"] / seconds, len(latencies) / seconds, float(p50),
                      float(p95), stats["first_error"])


def rss_mb(pid: int) -> float:
    """Resident memory of a process (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:5543")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--no-stream", action="store_true")
    p.add_argument("--api-key", default=None)
    p.add_argument("--pid", type=int, default=None, help="server pid, to report its memory")
    p.add_argument("--scaling", default=None,
                   help="comma-separated client counts: aggregate tokens/s of each vs the first")
    args = p.parse_args(argv)
    counts = [int(c) for c in args.scaling.split(",")] if args.scaling else [args.clients]
    base = None
    for clients in counts:
        before = rss_mb(args.pid) if args.pid else None
        r = asyncio.run(run_load(args.url, clients, args.requests, args.max_tokens,
                                 not args.no_stream, args.api_key))
        base = base or r.tokens_per_s
        line = (f"{clients:3d} clients: {r.requests} requests, {r.errors} errors, {r.tokens} "
                f"tokens in {r.seconds:.1f} s = {r.tokens_per_s:.0f} tok/s "
                f"({r.tokens_per_s / base:.2f}x), {r.requests_per_s:.2f} requests/s, latency "
                f"p50 {r.latency_p50:.2f} s, p95 {r.latency_p95:.2f} s")
        if args.pid:
            line += f"; server RSS {before:.0f} -> {rss_mb(args.pid):.0f} MB"
        print(line)
        if r.first_error:
            print("  first error:", r.first_error)
        print("  " + json.dumps(asdict(r)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
