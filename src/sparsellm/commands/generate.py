"""`sparsellm generate [MODEL] PROMPT`: stream a completion to the terminal."""

from __future__ import annotations

import argparse
import sys
import time

from ..engine import EngineSettings
from ..models import DEFAULT_MODEL


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
    EngineSettings.add_arguments(p)
    add_generation_arguments(p)


def main(args: argparse.Namespace) -> int:
    from ..pipeline import TextGeneration

    if len(args.inputs) > 2:
        raise ValueError("expected [MODEL] PROMPT (quote a prompt that has spaces)")
    model, prompt = (DEFAULT_MODEL, args.inputs[0]) if len(args.inputs) == 1 else args.inputs
    settings = EngineSettings.from_args(args, model_path=model, batch_size=1)
    pipeline = TextGeneration(settings=settings, **generation_kwargs(args))
    messages = None
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
            [{"role": "user", "content": prompt}]
    else:
        print(prompt, end="", flush=True)
    start = time.perf_counter()
    first, n, finished = None, 0, None
    for out in pipeline.stream(messages or prompt):
        first = first or time.perf_counter()
        generated = out.generations[0]
        print(generated.text, end="", flush=True)
        n += len(generated.token_ids)
        finished = generated.finished_reason
    end = time.perf_counter()
    first = first or end
    prompt_tokens = len(pipeline.encode_prompt(messages or prompt))
    decode_rate = (n - 1) / (end - first) if n > 1 and end > first else float("nan")
    print(flush=True)
    print(
        f"[{prompt_tokens} prompt tokens, {n} generated in {end - start:.2f} s; "
        f"time to first token {1000 * (first - start):.0f} ms, decode {decode_rate:.1f} tok/s; "
        f"finished: {finished}]",
        file=sys.stderr,
    )
    spec = pipeline.speculation
    if spec is not None and spec.steps:
        print(f"[speculative: acceptance {spec.acceptance_rate:.0%}, "
              f"{spec.tokens_per_step:.2f} tokens per step]", file=sys.stderr)
    return 0
