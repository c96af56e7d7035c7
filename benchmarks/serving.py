"""Serving: sparsellm's OpenAI server beside ik_llama.cpp's llama-server on the same weights,
many streams at once.

    python benchmarks/serving.py --ik-dir /tmp/ik [--pairs bf16 int8_a8 int4_g32] [--rounds 3]
        [--streams 16] [--requests 32] [--max-tokens 64] [--threads 2]
    python benchmarks/serving.py --pairs int8_a8 --rounds 1 --requests 4 --max-tokens 8  # ours only

Per pair (peers.py's PAIRS and checkpoints: ours runs the pair's folder with `--weights PAIR`,
llama-server the GGUF file of the same values), each server is started as a fresh process
per round on a free loopback port, `--threads` threads and `--streams` batch slots (ours:
`sparsellm serve --max-concurrent-requests`; llama-server: `-np`, with `-rtr` (row-interleaved
repacking at load) and `-fa on`, as its users run it for speed), and, once /health says ready,
answers one short untimed request (a server that has answered before), then `--requests`
streamed completions (/v1/completions, `stream: true`, `max_tokens`, `temperature: 0`,
`ignore_eos: true`, so every request generates exactly max_tokens) of a fixed, seeded set of
English prompts of 48-80 words, `--streams` in flight at a time. Measured per round: generated
tokens (the servers' own usage counts) / wall seconds from the first request sent to the last
answer (tok_s), the time from sending a request to its first streamed text, p50 and p99 over
the requests (ttft_p50_s, ttft_p99_s), and the requests that failed (errors). Both servers get
the same context per sequence (the longest prompt, max_tokens and a margin; llama-server's
`-c` is streams times that, since it splits its context between slots). Rounds alternate
systems (ours, peer, ours, peer...), every server is killed (its process group) after its
round, and the table holds medians; the record goes under benchmarks/results/
(benchmarks/records.py) and docs/benchmarks.md renders it (benchmarks/render.py).

ik_llama.cpp: built by shared/bench/build_ik_llama.sh into DIR (DIR/build/bin/llama-server),
as peers.py's docstring says. Without --ik-dir only ours runs (a smoke test of the harness).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import render
from peers import DEEPSPARSE, PAIRS, prepare
from records import machine, write_record

from sparsellm.server.loadtest import free_port, wait_healthy

DEFAULT_PAIRS = ["bf16", "int8_a8", "int4_g32"]
SERVING_PAIRS = [pair for pair in PAIRS if pair not in DEEPSPARSE]  # those ik_llama.cpp runs
WORDS = (48, 80)  # words per prompt
READY_TIMEOUT = 1800.0  # s: a 7B checkpoint converted or repacked at load takes minutes

# Pieces of the prompts: every prompt opens with a request and goes on with sentences.
ASKS = ["Write a short story that begins with the scene below.",
        "Summarise the following notes in plain words for a newspaper.",
        "Continue the text below in the same style and voice.",
        "Explain to a child what the passage below is about.",
        "Turn the following account into a formal letter to the mayor.",
        "List the questions a detective would ask after reading this.",
        "Rewrite the following paragraph as a poem with four verses.",
        "Describe how the people below might feel, and why."]
SUBJECTS = ["the old lighthouse keeper", "a young engineer from the valley", "our neighbour",
            "the city council", "a curious student", "the museum guide", "my grandmother",
            "the village orchestra", "a small family bakery", "the research team",
            "a tired bus driver", "the new librarian", "two sailors", "the farmer's daughter"]
VERBS = ["described", "repaired", "explained", "painted", "measured", "questioned", "planted",
         "organised", "forgot about", "discovered", "carried", "argued about", "sold", "found"]
OBJECTS = ["the broken clock in the station", "a map of the northern coast",
           "three reasons for the long delay", "the history of the stone bridge",
           "a recipe for apple bread", "the letters hidden under the floor",
           "a garden full of strange yellow flowers", "the price of bread in winter",
           "an old radio that still worked", "the plans for a new school",
           "a boat with a red sail", "the results of the spring election"]
TAILS = ["before the rain started", "while everyone else was asleep",
         "after a long and quiet winter", "with surprising patience",
         "for the first time in years", "because nobody else would",
         "on the busiest day of the market", "without telling anyone", "in front of the whole town",
         "as the last train left the station", "during the storm"]


def make_prompts(n: int, seed: int = 0) -> list[str]:
    """n varied English prompts of WORDS[0]-WORDS[1] words, the same for every run and system."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        target = rng.randint(*WORDS)
        words = rng.choice(ASKS).split()
        while len(words) < target:
            sentence = (f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} "
                        f"{rng.choice(TAILS)}.")
            words += (sentence[0].upper() + sentence[1:]).split()
        text = " ".join(words[:target])
        prompts.append(text if text.endswith(".") else text.rstrip(",") + ".")
    return prompts


def sequence_tokens(tokenizer_folder: Path, prompts: list[str], max_tokens: int) -> int:
    """Context per sequence both servers get: the longest prompt (in the checkpoint's tokenizer,
    special tokens included), max_tokens and a margin, rounded up to 64."""
    from sparsellm.tokenizer import Tokenizer

    tok = Tokenizer.from_files(tokenizer_folder)
    longest = max(len(tok.encode(p)) for p in prompts)
    return -(-(longest + max_tokens + 16) // 64) * 64


def server_command(system: str, path: Path, weights: str, port: int, threads: int, streams: int,
                   context: int, requests: int, ik_dir: Path | None) -> list[str]:
    """The command line that serves path on port: ours or ik_llama.cpp's llama-server (absolute
    paths: servers run in a scratch folder, where llama-server writes its llama.log)."""
    path = path.resolve()
    if system == "sparsellm":
        return [sys.executable, "-m", "sparsellm.cli", "serve", str(path), *(
            ["--weights", weights] if weights else []), "--port", str(port), "--num-cores",
            str(threads), "--max-concurrent-requests", str(streams), "--max-queue",
            str(requests), "--sequence-length", str(context), "--integration", "openai",
            "--log-level", "warning"]
    assert system == "ik_llama" and ik_dir is not None, system
    return [str(ik_dir.resolve() / "build" / "bin" / "llama-server"), "-m", str(path), "-t",
            str(threads), "-np", str(streams), "-c", str(streams * context), "-rtr", "-fa", "on",
            "--host", "127.0.0.1", "--port", str(port)]


@contextlib.contextmanager
def running(command: list[str], port: int, log_path: Path) -> Iterator[str]:
    """command started in a process group of its own, in log_path's folder -> its URL once
    /health answers 200; the whole group is killed on exit."""
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                cwd=log_path.parent, start_new_session=True)
        try:
            wait_healthy(url, proc, READY_TIMEOUT, log_path)
            yield url
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def one_request(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> dict:
    """One streamed completion -> {"ttft_s", "tokens"} or {"error"}."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    ttft, tokens, done = None, None, False
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return {"error": f"error event: {str(event['error'])[:200]}"}
            if ttft is None and any(c.get("text") for c in event.get("choices") or []):
                ttft = time.perf_counter() - sent
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    if not done or ttft is None or tokens is None:
        return {"error": f"incomplete stream: [DONE] {done}, text {ttft is not None}, "
                         f"usage {tokens is not None}"}
    return {"ttft_s": ttft, "tokens": tokens}


async def load(url: str, prompts: list[str], streams: int, max_tokens: int) -> dict:
    """Every prompt as a streamed completion, `streams` in flight at a time -> the round's
    figures: tok_s, ttft_p50_s, ttft_p99_s, errors, tokens, seconds, first_error."""
    todo = iter(prompts)
    answers: list[dict] = []

    async def worker(client: httpx.AsyncClient) -> None:
        for prompt in todo:
            try:
                answers.append(await one_request(client, prompt, max_tokens))
            except (httpx.HTTPError, json.JSONDecodeError) as e:
                answers.append({"error": f"{type(e).__name__}: {e}"})

    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as client:
        await one_request(client, prompts[0], 2)  # warm-up, untimed
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(streams)))
        seconds = time.perf_counter() - start
    good = [a for a in answers if "error" not in a]
    errors = [a["error"] for a in answers if "error" in a]
    tokens = sum(a["tokens"] for a in good)
    ttfts = [a["ttft_s"] for a in good]
    p50, p99 = (float(v) for v in np.percentile(ttfts, [50, 99])) if ttfts else (None, None)
    return {"tok_s": tokens / seconds, "ttft_p50_s": p50, "ttft_p99_s": p99,
            "errors": len(errors), "tokens": tokens, "seconds": seconds,
            "first_error": errors[0] if errors else None}


def measure(runs: dict[tuple[str, str], tuple[Path, str]], *, shape: str, prompts: list[str],
            context: int, rounds: int = 3, streams: int = 16, max_tokens: int = 64,
            threads: int = 2, ik_dir: Path | None = None) -> list[dict]:
    """runs: {(system, pair): (path, weights)}, systems "sparsellm" / "ik_llama" -> one row per
    run: its medians over interleaved rounds, each round's figures under "rounds"."""
    results: dict[tuple[str, str], list[dict]] = {key: [] for key in runs}
    with tempfile.TemporaryDirectory(prefix="serving-") as tmp:
        for r in range(rounds):
            for (system, pair), (path, weights) in runs.items():
                port = free_port()
                command = server_command(system, path, weights, port, threads, streams, context,
                                         len(prompts), ik_dir)
                with running(command, port, Path(tmp) / f"{system}-{pair}.log") as url:
                    figures = asyncio.run(load(url, prompts, streams, max_tokens))
                results[system, pair].append(figures)
                print(f"round {r + 1}: {system} {weights or pair}: {figures}", file=sys.stderr)
    return [{"shape": shape, "pair": pair, "system": system, "weights": runs[system, pair][1],
             "streams": streams, **{f: median(results[system, pair], f) for f in FIELDS},
             "errors": sum(f["errors"] for f in results[system, pair]),
             "rounds": results[system, pair]}
            for system, pair in runs]


FIELDS = ("tok_s", "ttft_p50_s", "ttft_p99_s")


def median(rounds: list[dict], field: str) -> float | None:
    values = [r[field] for r in rounds if r.get(field) is not None]
    return statistics.median(values) if values else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="tinyllama-1.1b")
    p.add_argument("--scratch", type=Path, default=Path("scratch/peers"))
    p.add_argument("--pairs", nargs="+", default=DEFAULT_PAIRS, choices=SERVING_PAIRS)
    p.add_argument("--ik-dir", type=Path,
                   help="ik_llama.cpp built by shared/bench/build_ik_llama.sh (its WORK_DIR); "
                        "without it only ours runs")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--streams", type=int, default=16, help="requests in flight = batch slots")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    if args.ik_dir and not (args.ik_dir / "build/bin/llama-server").exists():
        p.error("--ik-dir DIR needs DIR/build/bin/llama-server "
                "(shared/bench/build_ik_llama.sh GIT_DIR DIR builds it)")
    args.scratch.mkdir(parents=True, exist_ok=True)
    peers = ["ik_llama"] if args.ik_dir else []
    runs = prepare(args.shape, args.scratch, args.pairs, peers, sys.executable, sys.executable,
                   args.ik_dir)
    prompts = make_prompts(args.requests)
    folder = next((path for path, _ in runs.values() if path.is_dir()),  # its tokenizer
                  args.scratch / f"{args.shape}-dense")
    context = sequence_tokens(folder, prompts, args.max_tokens)
    where = machine(args.threads)
    rows = measure(runs, shape=args.shape, prompts=prompts, context=context, rounds=args.rounds,
                   streams=args.streams, max_tokens=args.max_tokens, threads=args.threads,
                   ik_dir=args.ik_dir)
    path = write_record("serving", rows, argv=sys.argv, threads=args.threads, machine_info=where,
                        extra={"rounds": args.rounds, "shape": args.shape,
                               "streams": args.streams, "requests": args.requests,
                               "max_tokens": args.max_tokens, "sequence_tokens": context})
    record = json.loads(path.read_text())
    record["file"] = path.name
    print(f"\n{args.shape}, {render.where(record)}, {args.requests} streamed completions of "
          f"{args.max_tokens} tokens, {args.streams} at a time; medians of {args.rounds} "
          "interleaved rounds (fresh server each)\n")
    for row in rows:
        print(f"{row['system']} {row['weights'] or row['pair']}: {render.num(row['tok_s'])} tok/s,"
              f" first token p50 {render.num(row['ttft_p50_s'], '.2f')} s, p99 "
              f"{render.num(row['ttft_p99_s'], '.2f')} s, {row['errors']} errors")
    if args.ik_dir:
        print("\n" + "\n".join(render.serving_table(record)))
    if any(row["errors"] for row in rows):
        print("\nsome requests failed: see each round's first_error in the record",
              file=sys.stderr)
    print(f"\nrecord: {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
