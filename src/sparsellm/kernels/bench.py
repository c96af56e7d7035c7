"""GEMV micro-benchmark: achieved weight bandwidth (GB/s) per format at SmolLM2-135M shapes.

    python -m sparsellm.kernels.bench [--formats int8,sparse_int8_a8] [--threads 1,2] [--isa avx2]

Decode is memory-bound, so GB/s = packed bytes of the matrix / time per GEMV says how close a
kernel is to the machine's read bandwidth. Each measurement cycles through enough copies of the
matrix to exceed the last-level cache, so the weights really come from DRAM. The last column
estimates the per-token time of all 135M-model linear layers (30 layers + lm_head) in that
format -- the number that decides decode tokens/s -- and its bandwidth as a percentage of a
plain streaming read measured in the same run (%ceil). "hot GB/s" runs 576x576 from cache: the
kernel's compute ceiling; a format is memory-bound when hot GB/s * threads > DRAM bandwidth.
The whole native model at the same shape: `python -m sparsellm.engine.bench`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from . import get_num_threads, pack, set_isa, set_num_threads
from ._ext import native
from .formats import FORMATS, FormatSpec, as_spec
from .layouts import Sparsity

# SmolLM2-135M: (out, in) of q/o, k/v, gate/up, down, lm_head; and how often each runs per token
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]
PER_TOKEN = {(576, 576): 60, (192, 576): 60, (1536, 576): 60, (576, 1536): 30, (49152, 576): 1}
DEFAULT_FORMATS = ["fp32", "fp16", "bf16", "int8", "int8_a8", "int4_g32", "int4_g32_asym",
                   "int4_g128", "sparse_fp32", "sparse_int8", "sparse_int8_a8", "sparse_int4_g32",
                   "2:4_int8", "2:4_int8_a8"]
CACHE_BYTES = 96 << 20  # > last-level cache


def make_weight(rng: np.random.Generator, shape: tuple[int, int], fmt: str | FormatSpec):
    w = rng.standard_normal(shape).astype(np.float32)
    fmt = as_spec(fmt)
    sparsity = fmt.sparsity
    if sparsity is Sparsity.TWO_FOUR:
        keep = np.argsort(rng.random((shape[0], shape[1] // 4, 4)), axis=2)[:, :, :2]
        m = np.zeros((shape[0], shape[1] // 4, 4), bool)
        np.put_along_axis(m, keep, True, axis=2)
        return pack(w, fmt, m.reshape(shape))
    if sparsity is Sparsity.BITMASK:
        return pack(w, fmt, rng.random(shape) < 0.5)  # 50% unstructured
    return pack(w, fmt)


def bench_gemv(fmt: str, shape: tuple[int, int], min_time: float = 0.2,
               hot: bool = False, tokens: int = 1, prompt: bool = False,
               dynamic_int8: bool = True) -> tuple[float, int]:
    """(seconds per linear() call, packed bytes) for one format and shape with `tokens` rows of
    activations (a prompt's, or decode / verification tokens), with the engine's default
    `dynamic_int8`. hot: the matrix stays in cache, which measures the kernel's compute ceiling
    instead of DRAM bandwidth."""
    rng = np.random.default_rng(0)
    p = make_weight(rng, shape, fmt)
    copies = 1 if hot else max(1, -(-CACHE_BYTES // p.nbytes))
    # Copies share nothing: re-pack would be slow, so copy the buffers.
    ws = [p.native()]
    for _ in range(copies - 1):
        q = type(p)(spec=p.spec, shape=p.shape, kp=p.kp,
                    arrays={k: v.copy() for k, v in p.arrays.items()})
        ws.append(q.native())
    x = rng.standard_normal((tokens, shape[1])).astype(np.float32)
    iters = copies
    while True:
        t0 = time.perf_counter()
        dt = native().bench_linear(ws, x, iters, prompt, dynamic_int8)
        if time.perf_counter() - t0 > min_time:
            return dt, p.nbytes
        iters *= 4


def arg_parser(description: str) -> argparse.ArgumentParser:
    """--formats, --threads, --isa: the options every micro-benchmark takes."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                    help=f"comma list from: {', '.join(FORMATS)}")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--isa", default="auto", choices=["auto", "avx512", "avx2", "scalar"])
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="",
                    help="comma list of T: time one model step's linear layers for T tokens on "
                         "the multi-token GEMV path vs the decoded-panel GEMM path")
    args = ap.parse_args(argv)
    set_isa(args.isa)
    if args.tokens:
        for nt in (int(t) for t in args.threads.split(",")):
            set_num_threads(nt)
            compare_paths(args.formats.split(","), [int(t) for t in args.tokens.split(",")], nt)
        return
    saved = get_num_threads()
    shape_names = ["576x576", "192x576", "1536x576", "576x1536", "49152x576"]
    print(f"GEMV GB/s (packed weight bytes / time), isa={native().get_isa()}; "
          "sparse = 50% unstructured, 2:4 = 50%")
    for nt in (int(t) for t in args.threads.split(",")):
        set_num_threads(nt)
        ceiling = native().read_bandwidth(256 << 20)
        print(f"\nthreads={nt}: plain streaming read {ceiling:.1f} GB/s (same run)")
        print(f"{'format':<16}" + "".join(f"{s:>11}" for s in shape_names) +
              f"{'MB/token':>10}{'ms/token':>10}{'%ceil':>7}{'hot GB/s':>10}")
        for fmt in args.formats.split(","):
            cells, total_s, total_b = [], 0.0, 0
            for shape in SHAPES:
                dt, nbytes = bench_gemv(fmt, shape)
                cells.append(f"{nbytes / dt / 1e9:11.1f}")
                total_s += PER_TOKEN[shape] * dt
                total_b += PER_TOKEN[shape] * nbytes
            pct = 100 * total_b / total_s / 1e9 / ceiling
            dt, nbytes = bench_gemv(fmt, (576, 576), hot=True)
            print(f"{fmt:<16}" + "".join(cells) + f"{total_b / 1e6:10.1f}{total_s * 1e3:10.2f}"
                  f"{pct:7.0f}{nbytes / dt / 1e9:10.1f}", flush=True)
    set_num_threads(saved)


def model_step_seconds(fmt: str, tokens: int) -> float:
    """Seconds of all linear layers of one 135M-model step over `tokens` tokens."""
    return sum(PER_TOKEN[shape] * bench_gemv(fmt, shape, min_time=0.1, tokens=tokens)[0]
               for shape in SHAPES)


def compare_paths(formats: list[str], tokens: list[int], threads: int) -> None:
    """Where the decoded-panel GEMM starts beating the multi-token GEMV (linear.h)."""
    print(f"\nthreads={threads}: ms per model step (all linear layers), GEMV path / GEMM path "
          "(ratio > 1: GEMM faster)")
    print(f"{'format':<16}" + "".join(f"{'T=' + str(t):>20}" for t in tokens))
    try:
        for fmt in formats:
            cells = []
            for t in tokens:
                native().set_gemv_max_tokens(t)
                g = model_step_seconds(fmt, t)
                native().set_gemv_max_tokens(1)
                p = model_step_seconds(fmt, t) if t > 1 else g
                cells.append(f"{g * 1e3:7.1f}/{p * 1e3:6.1f} {g / p:4.2f}")
            print(f"{fmt:<16}" + "".join(f"{c:>20}" for c in cells), flush=True)
    finally:
        native().set_gemv_max_tokens(0)


if __name__ == "__main__":
    main()
