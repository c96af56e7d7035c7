"""Load time, memory and decode speed per weight format at real model shapes, each figure over
several fresh processes with its spread (min / median / max across processes): a figure that
depends on the process (memory layout, page placement) shows as a wide spread instead of
hiding in one lucky run.

    python benchmarks/model_sizes.py --shapes tinyllama-1.1b llama-2-7b \
        --formats default int8_a8 sparse_int8_a8 --processes 3

Checkpoints are written once under --scratch by random_checkpoint.py (bf16, sharded like the
hub's; a 50%-pruned twin for the sparse formats). For each shape and format, one process
converts with an empty weights cache ("first load"), then --processes fresh processes load
from the cache and decode ("cached load"); the page cache is warm (the files were just read).
Columns: resident = RSS after loading (mapped file pages included), peak = the process's
maximum RSS, decode = tok/s of --tokens greedy tokens after a one-token prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from random_checkpoint import SHAPES, hf_folder
from records import write_record

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from sparsellm.engine import Engine
path, weights, cache, tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
t1 = time.perf_counter()
engine = Engine(path, sequence_length=tokens + 8, weights=None if weights == "default" else
                weights, weights_cache=cache)
t2 = time.perf_counter()
seq = engine.add_sequence()
token = int(engine.prefill(seq, [1])[0].argmax())
t3 = time.perf_counter()
for _ in range(tokens):
    token = int(engine.decode_step([seq], [token])[0].argmax())
t4 = time.perf_counter()
print(json.dumps({
    "import_s": t1 - t0, "load_s": t2 - t1, "first_token_s": t3 - t2,
    "decode_tok_s": tokens / (t4 - t3),
    "resident_gb": int(open("/proc/self/statm").read().split()[1]) * 4096 / 1e9,
    # VmHWM, not getrusage's maxrss: that one starts from the parent's RSS at exec
    "peak_gb": int(next(line for line in open("/proc/self/status")
                        if line.startswith("VmHWM:")).split()[1]) / 1e6,
    "weights_gb": engine.weight_bytes_per_step / 1e9, "formats": engine.weights_description,
}))
"""


def run_child(path: Path, weights: str, cache: Path, tokens: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), weights, str(cache),
                          str(tokens)], capture_output=True, text=True)
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(values: list[float], digits: int = 1) -> str:
    """'median (min-max)' over processes, or the one value."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-" \
           f"{max(values):.{digits}f})"


def checkpoint(scratch: Path, shape: str, sparse: bool) -> Path:
    return hf_folder(shape, scratch / (shape + ("-sparse50" if sparse else "")),
                     sparsity="0.5" if sparse else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["tinyllama-1.1b"], choices=sorted(SHAPES))
    p.add_argument("--formats", nargs="+", default=["default", "int8_a8", "sparse_int8_a8"])
    p.add_argument("--processes", type=int, default=3, help="fresh processes per figure")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--scratch", type=Path, default=Path("scratch/bench"))
    p.add_argument("--json", type=Path, default=None, help="also write every run here")
    args = p.parse_args()
    rows, runs, records = [], [], []
    print("| shape | weights | weights GB | first load s | cached load s | resident GB | "
          "peak GB | first token s | decode tok/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        for fmt in args.formats:
            path = checkpoint(args.scratch, shape, fmt.startswith(("sparse", "2:4")))
            cache = Path(tempfile.mkdtemp(prefix="sparsellm-bench-cache-"))
            try:
                first = run_child(path, fmt, cache, args.tokens)  # converts, writes the cache
                cached = [run_child(path, fmt, cache, args.tokens)
                          for _ in range(args.processes)]
            finally:
                shutil.rmtree(cache, ignore_errors=True)
            runs.append({"shape": shape, "weights": fmt, "first": first, "cached": cached})
            if "error" in first or any("error" in c for c in cached):
                err = first.get("error") or next(c["error"] for c in cached if "error" in c)
                print(f"| {shape} | {fmt} | error: {err} |||||||")
                continue
            converted = any(c["load_s"] < 0.5 * first["load_s"] for c in cached)
            rows.append(
                f"| {shape} | {fmt} ({first['formats']}) | {first['weights_gb']:.2f} | "
                f"{first['load_s']:.2f} | "
                f"{spread([c['load_s'] for c in cached], 2) if converted else 'same'} | "
                f"{spread([c['resident_gb'] for c in cached], 2)} | "
                f"{spread([first['peak_gb']] + [c['peak_gb'] for c in cached], 2)} | "
                f"{spread([c['first_token_s'] for c in cached], 2)} | "
                f"{spread([c['decode_tok_s'] for c in cached])} |")
            print(rows[-1], flush=True)
            def med(key: str, cached: list[dict] = cached) -> float:
                return statistics.median(c[key] for c in cached)

            records.append({"shape": shape, "weights": fmt, "formats": first["formats"],
                            "weights_gb": first["weights_gb"], "first_load_s": first["load_s"],
                            "cached_load_s": med("load_s") if converted else None,
                            "resident_gb": med("resident_gb"),
                            "peak_gb": statistics.median([first["peak_gb"]] +
                                                         [c["peak_gb"] for c in cached]),
                            "first_token_s": med("first_token_s"),
                            "decode_tok_s": med("decode_tok_s"),
                            "runs": {"first": first, "cached": cached}})
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    if records:
        path = write_record("model_sizes", records, argv=sys.argv, threads=os.cpu_count() or 1,
                            extra={"processes": args.processes, "tokens": args.tokens})
        print(f"record: {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
