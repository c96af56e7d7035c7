"""`sparsellm benchmark MODEL`: decode/prefill speed, latency, memory and bandwidth."""

from __future__ import annotations

import argparse

from ..engine.settings import ENGINE, SELF_DRAFT, SPECULATION, EngineSettings

# Flags of their own: the speculation benchmark compares drafting methods, so --draft-model
# (repeatable) and --prompt-lookup (default on) choose the methods it measures.
NOT_SETTINGS = ("draft_model_path", "prompt_lookup")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model path, GGUF file or registry name")
    EngineSettings.add_arguments(p, ["batch_size"], defaults={"batch_size": 1},
                                 flags={"batch_size": ("--batch-size", "-b")})
    p.add_argument("--scenario", "-s", choices=["sync", "async"], default="sync",
                   help="sync: one batch at a time; async: concurrent streams, kept full")
    p.add_argument("--input-ids-length", type=int, default=32, help="prompt tokens")
    p.add_argument("--generated-tokens", type=int, default=128)
    p.add_argument("--time", "-t", type=float, default=10.0, help="seconds to measure")
    p.add_argument("--warmup-time", "-w", type=float, default=2.0)
    EngineSettings.add_arguments(p, group=ENGINE, helps={
        "sequence_length": "KV-cache tokens per sequence (default: prompt + generated)"})
    p.add_argument("--compare", default=None, metavar="MODEL2",
                   help="benchmark a second model in the same process, in alternating rounds, "
                        "and print the ratio")
    p.add_argument("--rounds", type=int, default=None,
                   help="with --compare: alternating rounds of --time / rounds seconds each "
                        "(default 5); with --speculation: runs of every prompt and method, "
                        "each time the median (default 1)")
    spec = p.add_argument_group(
        "speculative decoding", "--speculation: plain decode and each drafting method on every "
        "prompt of a prompt set, greedy, one prompt at a time; per method the speedup over "
        "plain decode (median, worst, best, per kind of prompt), the acceptance rate and "
        "whether every output equals plain decode's")
    spec.add_argument("--speculation", action="store_true",
                      help="benchmark speculative decoding (implied by --prompts and "
                           "--draft-model)")
    spec.add_argument("--prompts", default=None, metavar="FILE",
                      help="JSON lines ({\"prompt\": ...} or {\"messages\": [...]}, optional "
                           "\"name\", \"kind\") or one prompt per line (default: the shipped "
                           "set of code, prose, chat and copy-heavy prompts)")
    spec.add_argument("--draft-model", action="append", default=None, metavar="DRAFT",
                      help="a draft model to benchmark, alone and behind prompt lookup; "
                           "repeatable; 'auto': the model drafting for itself (the default)")
    spec.add_argument("--prompt-lookup", action=argparse.BooleanOptionalAction, default=True,
                      help="benchmark prompt lookup, alone and in front of each draft "
                           "(default: yes)")
    EngineSettings.add_arguments(spec, group=SPECULATION, exclude=NOT_SETTINGS)
    p.add_argument("--export-json", default=None, metavar="FILE")


def main(args: argparse.Namespace) -> int:
    from ..atomic import write_json_atomic
    from ..benchmark import benchmark, benchmark_compare, compare_report

    rounds = args.rounds
    given = {k: v for k, v in EngineSettings.given(args).items() if k not in NOT_SETTINGS}
    if args.speculation or args.prompts or args.draft_model:
        from ..speculation_benchmark import DEFAULT_PROMPTS, benchmark_speculation

        given.pop("batch_size")  # one prompt at a time
        result = benchmark_speculation(
            args.model, args.prompts or DEFAULT_PROMPTS,
            draft_models=args.draft_model or [SELF_DRAFT], prompt_lookup=args.prompt_lookup,
            generated_tokens=args.generated_tokens, rounds=1 if rounds is None else rounds,
            **given)
        print(result.report())
        if args.export_json:
            write_json_atomic(args.export_json, result.to_dict())
        return 0

    settings = dict(scenario=args.scenario, input_ids_length=args.input_ids_length,
                    generated_tokens=args.generated_tokens, time_limit=args.time,
                    warmup_time=args.warmup_time, **given)
    if args.compare:
        results = list(benchmark_compare(args.model, args.compare,
                                         rounds=5 if rounds is None else rounds, **settings))
        print(results[0].report())
        print()
        print(results[1].report())
        print()
        print(compare_report(results[0], results[1]))
    else:
        results = [benchmark(args.model, **settings)]
        print(results[0].report())
    if args.export_json:
        write_json_atomic(args.export_json, [r.to_dict() for r in results])
    return 0
