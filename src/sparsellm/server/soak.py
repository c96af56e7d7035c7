"""A bounded soak run against a real `sparsellm serve`: many mixed requests, flat memory, no 5xx.

    python -m sparsellm.server.soak                       # starts `sparsellm serve` (default model)
    python -m sparsellm.server.soak --requests 60 --model ./tiny
    python -m sparsellm.server.soak --url http://127.0.0.1:5543 --pid 1234   # a running server

Requests of every kind the server takes, in a seeded random order, `--concurrency` at a time:
completions and chat replies, streamed and not (some with `n` = 2, stop strings, logprobs),
prompt scoring (`echo` + `logprobs`, with and without generated tokens, on prompts up to
`--score-chars` characters), /predict, streams the client drops after their first chunk,
non-streamed requests it abandons while they wait, and malformed bodies (each must be a 4xx).
The server's resident memory is read at the start, after the first 100 answers (the baseline:
by then the weights' pages and the KV cache are touched; half the run if it is shorter), at its
peak (sampled every 0.1 s) and at the end. The run passes (exit status 0) with no 5xx other than
503, no answer that breaks its kind's contract, and RSS at the end within `--rss-tolerance` of
the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from .loadtest import free_port, rss_mb, wait_healthy

# kind -> weight in the mix
KINDS = {"completion": 14, "completion_stream": 14, "chat": 10, "chat_stream": 10,
         "score": 8, "score_generate": 4, "predict": 5, "disconnect_stream": 10,
         "abandon": 4, "malformed": 18}
PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n", "class Point:\n    def __init__(",
           "The quick brown fox", "# sort a list of numbers\n", "SELECT name FROM users WHERE"]
QUESTIONS = ["What is a prime number?", "Write a haiku about the sea.", "Say hello.",
             "How do I reverse a list in Python?"]
# The longest prompt scored, in characters (~300 tokens of SmolLM2's), and the started server's
# prompt chunk: scored prompts span up to 3 chunks, and the run stays bounded (a 2-core machine
# prefills a few hundred tokens a second).
SCORE_CHARS = 1400
SERVE_ARGS = "--prompt-processing-sequence-length 128"
# (route, body bytes, content type): each must be answered with a 4xx
MALFORMED: list[tuple[str, bytes, str]] = [
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 4', "application/json"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 4, "bogus": 1}', "application/json"),
    ("/v1/completions", b'{"prompt": 5}', "application/json"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": -3}', "application/json"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 100000000}', "application/json"),
    ("/v1/completions", b'{"prompt": [999999999], "max_tokens": 2}', "application/json"),
    ("/v1/completions", b'{"prompt": "x", "n": 1000}', "application/json"),
    ("/v1/completions", b'{"prompt": "x", "temperature": "hot"}', "application/json"),
    ("/v1/completions", b'{"prompt": "x", "model": "no-such-model"}', "application/json"),
    ("/v1/completions", b'[1, 2, 3]', "application/json"),
    ("/v1/completions", b'\xff\xfe{"prompt"', "application/json"),
    ("/v1/completions", b'prompt=x', "text/plain"),
    ("/v1/chat/completions", b'{"messages": []}', "application/json"),
    ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "x"}]}',
     "application/json"),
    ("/v1/chat/completions", b'{"messages": "hi", "top_logprobs": 2}', "application/json"),
    ("/predict", b'{"sequences": 3}', "application/json"),
    ("/predict", b'{"sequences": "x", "max_generated_tokens": 0}', "application/json"),
]


@dataclass
class SoakResult:
    requests: int
    concurrency: int
    seconds: float
    statuses: dict[int, int]  # HTTP status -> responses (0: no response, the client left first)
    kinds: dict[str, int]
    rss_start_mb: float
    baseline_answers: int  # answers before rss_baseline_mb was read
    rss_baseline_mb: float
    rss_peak_mb: float
    rss_end_mb: float
    latency_p50: float  # seconds from sending to the last byte, over the answered requests
    latency_p99: float
    latency_p50_by_kind: dict[str, float] = field(default_factory=dict)
    client_left: int = 0  # streams dropped after their first chunk, requests abandoned waiting
    # answers that break their kind's contract
    failures: list[str] = field(default_factory=list)
    # the server's own counts at the end (/metrics): disconnects it saw, errors it sent inside
    # streams, and requests still in batch slots or queued once the run has settled (a
    # cancelled request that kept its slot would stay there)
    server_disconnects: float = float("nan")
    server_stream_errors: float = float("nan")
    still_running: float = float("nan")
    # error lines of the started server's log (not read for a server given by --url)
    server_log_errors: list[str] = field(default_factory=list)

    @property
    def server_errors(self) -> int:
        """5xx responses other than 503 (overload or shutdown, deliberate)."""
        return sum(n for s, n in self.statuses.items() if s >= 500 and s != 503)

    @property
    def rss_growth(self) -> float:
        """RSS at the end over the baseline's, minus 1."""
        return self.rss_end_mb / self.rss_baseline_mb - 1

    def problems(self, rss_tolerance: float = 0.10) -> list[str]:
        out = []
        if self.server_errors:
            out.append(f"{self.server_errors} responses with a 5xx status other than 503")
        if self.failures:
            out.append(f"{len(self.failures)} answers broke their contract, e.g. "
                       f"{self.failures[0]}")
        if self.server_stream_errors:
            out.append(f"the server sent {self.server_stream_errors:.0f} errors inside streams")
        if self.still_running != 0:  # (NaN too: not read)
            out.append(f"{self.still_running:.0f} requests still in the server's slots or queue "
                       "after the run")
        if self.server_log_errors:
            out.append(f"the server logged {len(self.server_log_errors)} errors, e.g. "
                       f"{self.server_log_errors[0]}")
        if not self.rss_growth <= rss_tolerance:  # (NaN too: memory not read)
            out.append(f"RSS grew {self.rss_growth:.1%} from the first {self.baseline_answers} "
                       f"answers to the end ({self.rss_baseline_mb:.0f} -> "
                       f"{self.rss_end_mb:.0f} MB)")
        return out

    def summary(self) -> str:
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        return (f"{self.requests} requests, {self.concurrency} at a time, in {self.seconds:.0f} s;"
                f" status codes {{{statuses}}}, {self.client_left} left by their client on "
                f"purpose; latency p50 {self.latency_p50:.2f} s, p99 "
                f"{self.latency_p99:.2f} s; server RSS start {self.rss_start_mb:.0f} MB, after "
                f"{self.baseline_answers} answers {self.rss_baseline_mb:.0f} MB, peak "
                f"{self.rss_peak_mb:.0f} MB, end {self.rss_end_mb:.0f} MB "
                f"({self.rss_growth:+.1%} since {self.baseline_answers})")


def score_prompts(max_chars: int) -> list[str]:
    """Real code of varied lengths, up to max_chars characters: the standard library's
    argparse, on every machine."""
    text = Path(argparse.__file__).read_text()
    sizes = [max_chars // 8, max_chars // 4, max_chars // 2, max_chars]
    return [text[i * 97:i * 97 + n] for i, n in enumerate(sizes)]


def plan(requests: int, seed: int) -> list[str]:
    """The kind of each request, in order."""
    rng = random.Random(seed)
    names, weights = list(KINDS), list(KINDS.values())
    return rng.choices(names, weights, k=requests)


async def one(client: httpx.AsyncClient, kind: str, rng: random.Random, max_tokens: int,
              scoring: list[str]) -> tuple[int, bool, str | None]:
    """Send one request of `kind` -> (HTTP status or 0, answered in full, failure or None)."""
    if kind == "malformed":
        route, content, ctype = rng.choice(MALFORMED)
        r = await client.post(route, content=content, headers={"content-type": ctype})
        ok = 400 <= r.status_code < 500
        return r.status_code, True, None if ok else f"malformed {content[:40]!r} to {route} " \
            f"-> {r.status_code}: {r.text[:200]}"
    if kind == "abandon":  # the client gives up while the request waits or runs
        body = {"prompt": rng.choice(PROMPTS), "max_tokens": 4 * max_tokens, "ignore_eos": True}
        try:
            r = await asyncio.wait_for(client.post("/v1/completions", json=body),
                                       rng.uniform(0.05, 0.5))
        except TimeoutError:
            return 0, False, None
        return r.status_code, True, _check_json(kind, r)
    stream = kind.endswith("_stream")
    route, body = _body(kind, rng, max_tokens, scoring)
    if not stream:
        r = await client.post(route, json=body)
        return r.status_code, True, _check_json(kind, r)
    leave = kind == "disconnect_stream"
    async with client.stream("POST", route, json=body) as r:
        if r.status_code != 200:
            text = (await r.aread())[:200]
            return r.status_code, True, f"{kind} -> {r.status_code}: {text!r}"
        done = False
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return r.status_code, True, f"{kind}: error event {event['error']}"
            if leave:  # leave after the first chunk: the connection closes with the stream
                return r.status_code, False, None
        return r.status_code, True, None if done else f"{kind}: stream ended without [DONE]"


def _body(kind: str, rng: random.Random, max_tokens: int,
          scoring: list[str]) -> tuple[str, dict[str, Any]]:
    n_tokens = rng.randint(1, max_tokens)
    sampling: dict[str, Any] = rng.choice([{"temperature": 0}, {"temperature": 0.8, "seed": 1},
                                           {"temperature": 1.0, "top_p": 0.9}])
    if kind.startswith("chat"):
        body = {"messages": [{"role": "user", "content": rng.choice(QUESTIONS)}],
                "max_tokens": n_tokens, **sampling}
        if rng.random() < 0.3:
            body.update(logprobs=True, top_logprobs=2)
        if kind == "chat_stream":
            body.update(stream=True, stream_options={"include_usage": True})
        return "/v1/chat/completions", body
    if kind.startswith("score"):
        generated = n_tokens if kind == "score_generate" else 0
        return "/v1/completions", {"prompt": rng.choice(scoring), "max_tokens": generated,
                                   "echo": True, "logprobs": rng.choice([0, 1, 5]),
                                   "temperature": 0}
    if kind == "predict":
        return "/predict", {"sequences": rng.choice(PROMPTS), "max_generated_tokens": n_tokens}
    body = {"prompt": rng.choice(PROMPTS), "max_tokens": n_tokens, **sampling}
    if rng.random() < 0.2:
        body["n"] = 2
    if rng.random() < 0.2:
        body["stop"] = ["\n"]
    if kind == "disconnect_stream":
        body.update(max_tokens=4 * max_tokens, ignore_eos=True)
    if kind.endswith("_stream"):
        body["stream"] = True
    return "/v1/completions", body


def _check_json(kind: str, r: httpx.Response) -> str | None:
    """A non-streamed answer: 200 with the kind's shape, or a 429 (at capacity, deliberate)."""
    if r.status_code == 429:
        return None
    if r.status_code != 200:
        return f"{kind} -> {r.status_code}: {r.text[:200]}"
    data = r.json()
    if kind == "predict":
        return None if isinstance(data.get("sequences"), list) else f"predict: {data}"[:200]
    choice = data["choices"][0]
    if kind.startswith("score"):
        lp = choice["logprobs"]
        scored = len(lp["tokens"]) - data["usage"]["completion_tokens"]
        if scored != data["usage"]["prompt_tokens"] or lp["token_logprobs"][0] is not None:
            return f"{kind}: {scored} prompt tokens scored of {data['usage']['prompt_tokens']}"
    return None


async def run_soak(url: str, pid: int | None, requests: int = 2000, concurrency: int = 16,
                   max_tokens: int = 8, seed: int = 0, score_chars: int = SCORE_CHARS,
                   timeout: float = 300.0, api_key: str | None = None) -> SoakResult:
    """Send `requests` mixed requests, `concurrency` at a time, to the server at `url` (whose
    process is `pid`, for its memory; None: memory not read)."""
    kinds = plan(requests, seed)
    scoring = score_prompts(score_chars)
    todo: Iterator[int] = iter(range(requests))
    statuses: Counter[int] = Counter()
    latencies: list[tuple[str, float]] = []
    failures: list[str] = []
    baseline = min(100, requests // 2)
    rss = {"start": rss_mb(pid) if pid else float("nan"), "baseline": float("nan")}
    peak = rss["start"]
    answered = left = 0
    running = True

    async def sample() -> None:
        nonlocal peak
        while running and pid:
            peak = max(peak, rss_mb(pid))
            await asyncio.sleep(0.1)

    async def worker(w: int) -> None:
        nonlocal answered, left
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with httpx.AsyncClient(base_url=url, timeout=timeout, headers=headers) as client:
            for i in todo:
                rng = random.Random(seed * 1_000_003 + i)
                sent = time.perf_counter()
                try:
                    status, complete, failure = await one(client, kinds[i], rng, max_tokens,
                                                          scoring)
                except httpx.HTTPError as e:
                    status, complete, failure = 0, False, f"{kinds[i]}: {type(e).__name__}: {e}"
                statuses[status] += 1
                if failure:
                    failures.append(failure)
                if complete:
                    latencies.append((kinds[i], time.perf_counter() - sent))
                elif not failure:
                    left += 1
                answered += 1
                if answered == baseline and pid:
                    rss["baseline"] = rss_mb(pid)

    sampler = asyncio.ensure_future(sample())
    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    seconds = time.perf_counter() - start
    running = False
    await sampler
    end = rss_mb(pid) if pid else float("nan")
    counts = await settled_counts(url, api_key)
    times = [t for _, t in latencies]
    p50, p99 = np.percentile(times, [50, 99]) if times else (float("nan"),) * 2
    by_kind = {k: float(np.median([t for kind, t in latencies if kind == k]))
               for k in KINDS if any(kind == k for kind, _ in latencies)}
    return SoakResult(requests, concurrency, seconds, dict(statuses), dict(Counter(kinds)),
                      rss["start"], baseline, rss["baseline"], max(peak, end), end, float(p50),
                      float(p99), by_kind, left, failures, **counts)


async def settled_counts(url: str, api_key: str | None, wait: float = 10.0
                         ) -> dict[str, float]:
    """The server's disconnects, stream errors and active + queued requests from /metrics,
    once nothing runs (or after `wait` seconds: cancellations take effect between steps)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + wait
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
        while True:
            text = (await client.get("/metrics")).text
            values: Counter[str] = Counter()
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    name, value = line.rsplit(" ", 1)
                    values[name.split("{")[0]] += float(value)
                    if name == 'sparsellm_errors_total{status="stream"}':
                        values["stream_errors"] += float(value)
            running = values["sparsellm_active_requests"] + values["sparsellm_queue_depth"]
            if running == 0 or time.monotonic() > deadline:
                return {"server_disconnects": values["sparsellm_client_disconnects_total"],
                        "server_stream_errors": values["stream_errors"],
                        "still_running": running}
            await asyncio.sleep(0.2)


def logged_errors(log: str) -> list[str]:
    """The lines of a server log that report an error (ours and uvicorn's: `ERROR:`,
    `CRITICAL:`, a traceback)."""
    return [line for line in log.splitlines()
            if line.startswith(("ERROR", "CRITICAL", "Traceback"))]


# ---- a server of our own -------------------------------------------------------------------------
@contextlib.contextmanager
def serve_subprocess(serve_args: list[str], log_path: Path,
                     ready_timeout: float = 600.0) -> Iterator[tuple[str, int]]:
    """`sparsellm serve ARGS` on a free loopback port -> (url, pid) once /health says ready;
    stopped with SIGINT (its drain) on exit. Its output goes to log_path."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "sparsellm.cli", "serve", "--port", str(port),
           "--log-level", "warning", *serve_args]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, proc, ready_timeout, log_path)
            yield url, proc.pid
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=None, help="a running server (default: start one)")
    p.add_argument("--pid", type=int, default=None, help="the running server's pid (its RSS)")
    p.add_argument("--model", default=None, help="the model the started server serves "
                                                   "(default: sparsellm serve's default)")
    p.add_argument("--serve-args", default=SERVE_ARGS,
                   help="more `sparsellm serve` arguments for the started server, one string "
                        f"(default {SERVE_ARGS!r}: prompts scored span several chunks)")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=8, help="most tokens a request generates")
    p.add_argument("--score-chars", type=int, default=SCORE_CHARS,
                   help="longest prompt scored, in characters")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rss-tolerance", type=float, default=0.10)
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    p.add_argument("--server-log", type=Path, default=None,
                   help="keep the started server's log here")
    args = p.parse_args(argv)

    def run(url: str, pid: int | None) -> SoakResult:
        return asyncio.run(run_soak(url, pid, args.requests, args.concurrency, args.max_tokens,
                                    args.seed, args.score_chars))

    if args.url:
        result = run(args.url, args.pid)
    else:
        serve_args = ([args.model] if args.model else []) + args.serve_args.split()
        with tempfile.TemporaryDirectory() as tmp:
            log = args.server_log or Path(tmp) / "server.log"
            with serve_subprocess(serve_args, log) as (url, pid):
                result = run(url, pid)
            result.server_log_errors = logged_errors(log.read_text())  # its shutdown's too
    print(result.summary())
    print("  p50 latency by kind:", ", ".join(
        f"{k} {t:.2f} s" for k, t in result.latency_p50_by_kind.items()))
    for failure in result.failures[:10]:
        print("  failure:", failure)
    for line in result.server_log_errors[:10]:
        print("  server log:", line)
    if args.json:
        args.json.write_text(json.dumps({**asdict(result), "kinds": result.kinds}, indent=1))
    problems = result.problems(args.rss_tolerance)
    for problem in problems:
        print("FAILED:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
