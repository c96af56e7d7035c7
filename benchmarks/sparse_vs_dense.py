"""Prefill and decode speed of each sparse weight format beside its dense twin (the same bit
width and activations: sparse_int8_a8 beside int8_a8, 2:4_int8 beside int8, ...), at a real
model shape. A sparse weight reads fewer bytes per decoded token but has to be expanded (or
walked) in the prompt's GEMM; this shows what it gains and whether that ever costs more than it
saves.

    python benchmarks/sparse_vs_dense.py --shape tinyllama-1.1b [--rounds 3] \
        [--formats sparse_int8_a8 2:4_int8 ...]

Checkpoints are written once under --scratch by random_checkpoint.py: the dense one, its
50%-pruned twin (bitmask formats) and its 2:4-pruned twin (2:4 formats). Every figure comes from
a fresh process (prefill: best of 3 prompts of 512 random tokens; decode: best of 2 runs of 32
greedy tokens after 8); rounds alternate sparse and dense, and the table holds medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from random_checkpoint import hf_folder
from records import write_record

from sparsellm.kernels.formats import FORMATS, dense_twin, parse_format
from sparsellm.kernels.layouts import Sparsity

PROMPT, DECODE = 512, 32
CHILD = f"PROMPT, DECODE = {PROMPT}, {DECODE}" + r"""
import json, sys, time
import numpy as np
from sparsellm.engine import Engine
engine = Engine(sys.argv[1], sequence_length=PROMPT + 8, weights=sys.argv[2])
rng = np.random.default_rng(0)
seq = engine.add_sequence()
engine.prefill(seq, [5, 6, 7])  # warm up: pages mapped, threads started
engine.release(seq)
best = float("inf")
for _ in range(3):
    seq = engine.add_sequence()
    ids = [int(t) for t in rng.integers(100, 40000, PROMPT)]
    t = time.perf_counter()
    engine.prefill(seq, ids)
    best = min(best, time.perf_counter() - t)
    engine.release(seq)
decode = float("inf")
for _ in range(2):
    seq = engine.add_sequence()
    token = int(np.argmax(engine.prefill(seq, [int(t) for t in rng.integers(100, 40000, 8)])))
    t = time.perf_counter()
    for _ in range(DECODE):
        token = int(np.argmax(engine.decode_step([seq], [token])[0]))
    decode = min(decode, time.perf_counter() - t)
    engine.release(seq)
print(json.dumps([PROMPT / best, DECODE / decode]))
"""
# Checkpoint variant per sparsity: folder suffix and random_checkpoint's --sparsity.
VARIANTS = {Sparsity.BITMASK: ("sparse50", "0.5"), Sparsity.TWO_FOUR: ("sparse24", "2:4")}


def speeds(path: Path, fmt: str) -> tuple[float, float]:
    """(prefill, decode) tok/s of one fresh process."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), fmt], capture_output=True,
                         text=True)
    if out.returncode:
        raise SystemExit(f"{fmt} on {path} failed: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    sparse = [f for f in FORMATS if parse_format(f).sparse]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="tinyllama-1.1b")
    p.add_argument("--scratch", type=Path, default=Path("scratch/peers"))
    p.add_argument("--formats", nargs="+", default=sparse, choices=sparse)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    args.scratch.mkdir(parents=True, exist_ok=True)
    dense = hf_folder(args.shape, args.scratch / f"{args.shape}-dense")
    runs = []  # (sparse format, its folder)
    for fmt in args.formats:
        name, sparsity = VARIANTS[parse_format(fmt).sparsity]
        runs.append((fmt, hf_folder(args.shape, args.scratch / f"{args.shape}-{name}", sparsity)))
    results: dict[str, list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for fmt, path in runs:
            for f, pth in ((fmt, path), (dense_twin(fmt), dense)):
                results.setdefault(f, []).append(speeds(pth, f))
                prefill, decode = results[f][-1]
                print(f"round {r + 1}: {f}: prefill {prefill:.0f}, decode {decode:.1f} tok/s",
                      file=sys.stderr)
    print(f"\n{args.shape}, tok/s: prefill of {PROMPT} tokens, decode of {DECODE}; medians of "
          f"{args.rounds} interleaved rounds (fresh process each)\n")
    print("| sparse format | dense twin | prefill | sparse / dense | decode | sparse / dense |")
    print("|---|---|---|---|---|---|")
    rows = []
    for fmt, _ in runs:
        s, d = (tuple(statistics.median(v) for v in zip(*results[f], strict=True))
                for f in (fmt, dense_twin(fmt)))
        print(f"| {fmt} | {dense_twin(fmt)} | {s[0]:.0f} vs {d[0]:.0f} | {s[0] / d[0]:.2f}x | "
              f"{s[1]:.1f} vs {d[1]:.1f} | {s[1] / d[1]:.2f}x |")
        rows.append({"shape": args.shape, "format": fmt, "dense_twin": dense_twin(fmt),
                     "prefill_tok_s": s[0], "dense_prefill_tok_s": d[0],
                     "decode_tok_s": s[1], "dense_decode_tok_s": d[1]})
    record = write_record("sparse_vs_dense", rows, argv=sys.argv, threads=os.cpu_count() or 1,
                          extra={"rounds": args.rounds, "shape": args.shape})
    print(f"\nrecord: {record}", file=sys.stderr)


if __name__ == "__main__":
    main()
