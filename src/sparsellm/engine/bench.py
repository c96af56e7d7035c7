"""Whole-model micro-benchmark: a random SmolLM2-135M-shaped NativeDecoderModel per format.

    python -m sparsellm.engine.bench [--formats int8,sparse_int8_a8] [--threads 1,2] [--isa avx2]

Decode and prefill tokens/s of the native forward alone (no tokenizer, sampling or engine
bookkeeping), with the packed weight MB and the bandwidth decode reaches (GB/s = packed bytes
streamed per token * tokens/s). The per-kernel view of the same shapes is
`python -m sparsellm.kernels.bench`; real checkpoints go through `sparsellm benchmark`.
"""

from __future__ import annotations

import time

import numpy as np

from ..kernels import get_num_threads, set_isa, set_num_threads
from ..kernels.bench import arg_parser, make_weight
from ..kernels.formats import parse_format
from ..kernels.reference import dequantize
from ..models.decoder import ModelArgs, layer_weight_names, linear_weight_names
from .native_model import NativeDecoderModel


def bench_model(fmt: str, steps: int = 32, prompt: int = 128) -> tuple[float, float, int]:
    """Random SmolLM2-135M-shaped NativeDecoderModel in one format (lm_head: the dense twin of
    the format): (decode tokens/s, prefill tokens/s, packed weight bytes)."""
    spec = parse_format(fmt)
    args = ModelArgs(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                     tie_word_embeddings=True, rope_theta=100000.0)
    rng = np.random.default_rng(0)
    tensors = {"model.embed_tokens.weight": rng.standard_normal((49152, 576), np.float32) * .02,
               "model.norm.weight": np.ones(576, np.float32)}
    masks = {}
    for i in range(args.num_hidden_layers):
        for name in layer_weight_names(args, i):
            if name.endswith("layernorm.weight"):
                tensors[name] = np.ones(576, np.float32)
                continue
            rows = {"q_": 576, "k_": 192, "v_": 192, "o_": 576, "ga": 1536, "up": 1536,
                    "do": 576}[name.split(".")[-2][:2]]
            cols = 1536 if "down" in name else 576
            tensors[name] = rng.standard_normal((rows, cols), np.float32) * .05
            p = make_weight(rng, (rows, cols), spec)  # for the mask only
            if p.spec.sparse:
                masks[name] = dequantize(p) != 0
    formats = dict.fromkeys(linear_weight_names(args), spec)
    formats["lm_head.weight"] = spec.dense_twin
    model = NativeDecoderModel(args, tensors, formats, masks=masks, max_tokens=prompt)
    cache = (1, 1, 3, prompt + steps + 1, 64)
    k, v = np.zeros((30, *cache[1:]), np.float32), np.zeros((30, *cache[1:]), np.float32)
    tokens = rng.integers(0, 49152, prompt)
    zeros = np.zeros(prompt, np.int64)
    t0 = time.perf_counter()
    model.forward(tokens, zeros, np.arange(prompt), k, v, np.array([prompt - 1]), prompt=True)
    prefill = prompt / (time.perf_counter() - t0)
    one = np.zeros(1, np.int64)
    t0 = time.perf_counter()
    for s in range(steps):
        model.forward(tokens[s:s + 1], one, np.array([prompt + s]), k, v, one)
    decode = steps / (time.perf_counter() - t0)
    return decode, prefill, model.weight_bytes


def main_model(formats: list[str]) -> None:
    print("\nRandom SmolLM2-135M-shaped model, NativeDecoderModel (lm_head in the dense twin "
          "format), prompt 128, 32 decode steps")
    print(f"{'format':<16}{'MB':>8}{'decode tok/s':>14}{'GB/s':>8}{'prefill tok/s':>15}")
    for fmt in formats:
        decode, prefill, nbytes = bench_model(fmt)
        print(f"{fmt:<16}{nbytes / 1e6:8.1f}{decode:14.1f}{decode * nbytes / 1e9:8.1f}"
              f"{prefill:15.1f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = arg_parser(__doc__.split("\n")[0]).parse_args(argv)
    set_isa(args.isa)
    saved = get_num_threads()
    try:
        for nt in (int(t) for t in args.threads.split(",")):
            set_num_threads(nt)
            print(f"\nthreads={nt}")
            main_model(args.formats.split(","))
    finally:
        set_num_threads(saved)


if __name__ == "__main__":
    main()
