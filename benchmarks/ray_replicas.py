"""Scale-out on one machine: `sparsellm serve` against the Ray Serve application with 1 and 2
replicas, the same cores in total, measured with the project's load test (requests/s, tokens/s,
latency p50/p95), configurations in alternating rounds.

    python benchmarks/ray_replicas.py --model smollm2-135m-instruct --cores 2 --rounds 2

Every configuration uses `--cores` threads in all: `serve` one engine of that many threads, Ray
one replica of that many or `--cores` replicas of one thread each. The load is --clients
concurrent streaming (or --no-stream) completions of --max-tokens tokens (ignore_eos),
--requests in all.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys

from records import write_record

from sparsellm.server.loadtest import LoadResult, free_port, run_load, wait_healthy


def load(url: str, args: argparse.Namespace) -> LoadResult:
    stream = not args.no_stream
    asyncio.run(run_load(url, args.clients, args.clients, args.max_tokens, stream))  # warm up
    return asyncio.run(run_load(url, args.clients, args.requests, args.max_tokens, stream))


def measure_serve(args: argparse.Namespace) -> LoadResult:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sparsellm.cli", "serve", args.model,
                             "--port", str(port), "--num-cores", str(args.cores),
                             "--max-concurrent-requests", str(args.slots),
                             "--log-level", "warning"])
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        return load(f"http://127.0.0.1:{port}", args)
    finally:
        proc.terminate()
        proc.wait()


def measure_ray(args: argparse.Namespace, replicas: int, url: str) -> LoadResult:
    from ray import serve

    from sparsellm.cluster.serve import app

    serve.run(app({"model": args.model, "num_replicas": replicas,
                   "num_cores": args.cores // replicas,
                   "max_concurrent_requests": args.slots}), name="bench", route_prefix="/")
    try:
        wait_healthy(url)
        return load(url, args)
    finally:
        serve.delete("bench")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--slots", type=int, default=8, help="batch slots per engine")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no-stream", action="store_true", help="whole responses, not streamed")
    args = p.parse_args()

    import ray
    from ray import serve

    ray.init(num_cpus=args.cores, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={
        "log_level": "WARNING"})
    url = f"http://127.0.0.1:{port}"
    configs = {"sparsellm serve": lambda: measure_serve(args),
               "Ray Serve, 1 replica": lambda: measure_ray(args, 1, url)}
    if args.cores > 1:
        configs[f"Ray Serve, {args.cores} replicas"] = lambda: measure_ray(args, args.cores, url)
    results: dict[str, list[LoadResult]] = {name: [] for name in configs}
    for r in range(args.rounds):
        names = list(configs) if r % 2 == 0 else list(reversed(configs))
        for name in names:
            result = configs[name]()
            if result.errors:
                print(f"{name}: {result.errors} errors, first: {result.first_error}")
            results[name].append(result)
            print(f"round {r + 1} {name}: {result.requests_per_s:.2f} req/s, "
                  f"{result.tokens_per_s:.0f} tok/s, p50 {result.latency_p50:.2f} s, "
                  f"p95 {result.latency_p95:.2f} s", flush=True)
    serve.shutdown()
    kind = "non-streamed" if args.no_stream else "streaming"
    print(f"\n{args.model}, {args.cores} cores in all, {args.clients} {kind} clients x "
          f"{args.max_tokens} tokens, {args.requests} requests, median of {args.rounds} rounds")
    print("| configuration | requests/s | tokens/s | latency p50 | latency p95 |")
    print("|---|---|---|---|---|")
    rows = []
    fields = ("requests_per_s", "tokens_per_s", "latency_p50", "latency_p95")
    for name, runs in results.items():
        def med(field: str, runs: list[LoadResult] = runs) -> float:
            return statistics.median(getattr(x, field) for x in runs)
        print(f"| {name} | {med('requests_per_s'):.2f} | {med('tokens_per_s'):.0f} | "
              f"{med('latency_p50'):.2f} s | {med('latency_p95'):.2f} s |")
        rows.append({"configuration": name, "streamed": not args.no_stream,
                     **{f: med(f) for f in fields},
                     "rounds": [{f: getattr(x, f) for f in fields} for x in runs]})
    path = write_record("ray_replicas", rows, argv=sys.argv, threads=args.cores,
                        extra={"model": args.model, "rounds": args.rounds,
                               "clients": args.clients, "requests": args.requests,
                               "max_tokens": args.max_tokens})
    print(f"record: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
