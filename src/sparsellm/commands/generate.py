"""`sparsellm generate [MODEL] PROMPT`: stream a completion to the terminal."""

from __future__ import annotations

import argparse
import sys
import time

from ..models import DEFAULT_MODEL


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """Engine settings shared by `generate` and `serve`; unset ones are None (engine_kwargs)."""
    p.add_argument("--sequence-length", type=int, default=None,
                   help="tokens per sequence, prompt + generated (default: an exported "
                   "deployment's, else 1024)")
    p.add_argument("--prompt-processing-sequence-length", type=int, default=None,
                   help="prompt tokens processed per step (default 256)")
    p.add_argument("--num-cores", type=int, default=None, help="threads (default: all cores)")
    p.add_argument("--weights", default=None, metavar="FORMAT",
                   help="convert every linear weight on load (e.g. int8_a8, int4_g32_a8) "
                   "instead of running the checkpoint's declared formats")
    p.add_argument("--weights-cache", default=None, metavar="DIR",
                   help="where converted weights are cached for the next load (default: "
                        "$SPARSELLM_CACHE_DIR, else ~/.cache/sparsellm)")
    p.add_argument("--no-weights-cache", dest="weights_cache", action="store_const",
                   const=False, help="convert on every load, write no cache entry")
    p.add_argument("--kv-cache-dtype", choices=["fp32", "fp16", "int8"], default=None,
                   help="KV-cache storage (fp16 / int8: a half / a quarter of the memory; "
                        "default fp32)")
    p.add_argument("--draft-model", default=None,
                   help="draft model for speculative decoding (same tokenizer, smaller or "
                        "compressed); 'auto': the model itself in a smaller format "
                        "(self-speculation, no second model)")
    p.add_argument("--draft-weights", default=None, metavar="FORMAT",
                   help="convert the draft's weights on load (with --draft-model auto, the "
                        "format the model drafts for itself in; default int8_a8)")
    p.add_argument("--prompt-lookup", action="store_true", default=None,
                   help="speculative decoding by prompt lookup: draft the tokens that followed "
                        "the last n-gram's earlier occurrence in the prompt or output (no model; "
                        "with --draft-model, the draft model drafts where lookup finds nothing)")
    p.add_argument("--num-speculative-tokens", type=int, default=None,
                   help="most tokens drafted per step (default 4)")
    p.add_argument("--adaptive-speculation", action=argparse.BooleanOptionalAction,
                   default=None,
                   help="draft as many tokens per step (0 to --num-speculative-tokens) as the "
                        "measured acceptance and drafting cost make worthwhile (default); "
                        "--no-adaptive-speculation drafts --num-speculative-tokens every step")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The add_engine_arguments given, as TextGeneration keyword arguments."""
    kwargs = dict(
        sequence_length=args.sequence_length,
        prompt_processing_sequence_length=args.prompt_processing_sequence_length,
        num_cores=args.num_cores,
        weights=args.weights,
        weights_cache=args.weights_cache,
        kv_cache_dtype=args.kv_cache_dtype,
        draft_model_path=args.draft_model,
        draft_weights=args.draft_weights,
        prompt_lookup=args.prompt_lookup,
        num_speculative_tokens=args.num_speculative_tokens,
        adaptive_speculation=args.adaptive_speculation,
    )
    return _given(kwargs)


def _given(kwargs: dict) -> dict:
    """The entries that were set (not None)."""
    return {k: v for k, v in kwargs.items() if v is not None}


def add_generation_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-generated-tokens", "--max-new-tokens", type=int, default=256)
    p.add_argument("--force-max-tokens", action="store_true", help="ignore end-of-sequence tokens")
    p.add_argument("--sample", action="store_true",
                   help="sample instead of greedy decoding "
                   "(implied by --temperature/--top-k/--top-p)")
    p.add_argument("--temperature", "--sampling-temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def generation_kwargs(args: argparse.Namespace) -> dict:
    sample = args.sample or any(v is not None for v in (args.temperature, args.top_k, args.top_p))
    kwargs = dict(
        max_generated_tokens=args.max_generated_tokens,
        force_max_tokens=args.force_max_tokens,
        deterministic=not sample,
        sampling_temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        stop=args.stop,
    )
    return _given(kwargs)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="[MODEL] PROMPT",
                   help=f"model (path, GGUF, registry name; default {DEFAULT_MODEL}) and prompt")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--system", default=None, help="system message for --chat")
    add_engine_arguments(p)
    add_generation_arguments(p)


def main(args: argparse.Namespace) -> int:
    from ..pipeline import TextGeneration

    if len(args.inputs) > 2:
        raise ValueError("expected [MODEL] PROMPT (quote a prompt that has spaces)")
    model, prompt = (DEFAULT_MODEL, args.inputs[0]) if len(args.inputs) == 1 else args.inputs
    pipeline = TextGeneration(model, batch_size=1, **engine_kwargs(args),
                              **generation_kwargs(args))
    messages = None
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
            [{"role": "user", "content": prompt}]
    else:
        print(prompt, end="", flush=True)
    request = pipeline.request(messages or prompt, pipeline.config_for())
    start = time.perf_counter()
    first = None
    pipeline.generator.add(request)
    while not request.finished:
        for event in pipeline.generator.step():
            first = first or time.perf_counter()
            print(event.text, end="", flush=True)
    end = time.perf_counter()
    n = len(request.output_ids)
    decode_rate = (n - 1) / (end - first) if n > 1 and end > first else float("nan")
    print(flush=True)
    print(
        f"[{len(request.prompt_ids)} prompt tokens, {n} generated in {end - start:.2f} s; "
        f"time to first token {1000 * (first - start):.0f} ms, decode {decode_rate:.1f} tok/s; "
        f"finished: {request.finished_reason}]",
        file=sys.stderr,
    )
    spec = pipeline.generator.speculation
    if pipeline.generator.speculator is not None and spec.steps:
        print(f"[speculative: acceptance {spec.acceptance_rate:.0%}, "
              f"{spec.tokens_per_step:.2f} tokens per step]", file=sys.stderr)
    return 0
