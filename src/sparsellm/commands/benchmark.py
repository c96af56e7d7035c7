"""`sparsellm benchmark MODEL`: decode/prefill speed, latency, memory and bandwidth."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model path, GGUF file or registry name")
    p.add_argument("--batch-size", "-b", type=int, default=1)
    p.add_argument("--scenario", "-s", choices=["sync", "async"], default="sync",
                   help="sync: one batch at a time; async: concurrent streams, kept full")
    p.add_argument("--sequence-length", type=int, default=None,
                   help="KV-cache tokens per sequence (default: prompt + generated)")
    p.add_argument("--input-ids-length", type=int, default=32, help="prompt tokens")
    p.add_argument("--generated-tokens", type=int, default=128)
    p.add_argument("--time", "-t", type=float, default=10.0, help="seconds to measure")
    p.add_argument("--warmup-time", "-w", type=float, default=2.0)
    p.add_argument("--num-cores", type=int, default=None, help="threads (default: all cores)")
    p.add_argument("--weights", default=None, metavar="FORMAT",
                   help="convert every linear weight on load (e.g. int8_a8, int4_g32_a8, "
                   "sparse_int8_a8; sparsellm.kernels.FORMATS)")
    p.add_argument("--kv-cache-dtype", choices=["fp32", "fp16", "int8"], default="fp32",
                   help="KV-cache storage (fp16 / int8: a half / a quarter of the bytes "
                        "attention reads)")
    p.add_argument("--compare", default=None, metavar="MODEL2",
                   help="benchmark a second model in the same process, in alternating rounds, "
                        "and print the ratio")
    p.add_argument("--rounds", type=int, default=5,
                   help="with --compare: alternating rounds of --time / rounds seconds each")
    p.add_argument("--draft-model", default=None, metavar="DRAFT",
                   help="compare autoregressive vs speculative decoding with this draft model")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--adaptive-speculation", action="store_true",
                   help="draft fewer tokens (down to 1) while drafts get rejected, up to "
                        "--num-speculative-tokens while they are accepted")
    p.add_argument("--draft-weights", default=None,
                   help="convert the draft's weights on load (e.g. sparse_int4_g32 for a pruned "
                        "checkpoint; its lm_head gets the dense twin, int4_g32)")
    p.add_argument("--export-json", default=None, metavar="FILE")


def main(args: argparse.Namespace) -> int:
    from ..atomic import write_json_atomic
    from ..benchmark import benchmark, benchmark_compare, benchmark_speculative, compare_report

    if args.draft_model:
        spec = benchmark_speculative(
            args.model, args.draft_model, args.num_speculative_tokens,
            prompts=max(args.batch_size, 4), input_ids_length=args.input_ids_length,
            generated_tokens=args.generated_tokens, num_cores=args.num_cores,
            weights=args.weights, draft_weights=args.draft_weights,
            adaptive=args.adaptive_speculation, kv_cache_dtype=args.kv_cache_dtype)
        print(spec.report())
        if args.export_json:
            write_json_atomic(args.export_json, spec.to_dict())
        return 0

    settings = dict(batch_size=args.batch_size, scenario=args.scenario,
                    input_ids_length=args.input_ids_length, generated_tokens=args.generated_tokens,
                    sequence_length=args.sequence_length, time_limit=args.time,
                    warmup_time=args.warmup_time, num_cores=args.num_cores,
                    kv_cache_dtype=args.kv_cache_dtype)
    if args.compare:
        results = list(benchmark_compare(args.model, args.compare, rounds=args.rounds,
                                         weights=args.weights, **settings))
        print(results[0].report())
        print()
        print(results[1].report())
        print()
        print(compare_report(results[0], results[1]))
    else:
        results = [benchmark(args.model, weights=args.weights, **settings)]
        print(results[0].report())
    if args.export_json:
        write_json_atomic(args.export_json, [r.to_dict() for r in results])
    return 0
