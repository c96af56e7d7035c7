"""`sparsellm batch PROMPTS OUT`: generate for every row of a file, with continuous batching,
in this process or fanned out over a Ray cluster; a rerun continues where a run stopped.

    sparsellm batch requests.jsonl results.jsonl --model ./pruned50-quant  # Batch API form
    sparsellm batch prompts.txt results.jsonl --max-new-tokens 128        # a prompt per line
    sparsellm batch prompts.txt results.jsonl --ray          # Ray: $RAY_ADDRESS or a new one
    sparsellm batch prompts.txt results.jsonl --ray 10.0.0.5:6379 --num-cores 4
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial

from ..engine import EngineSettings
from ..models import DEFAULT_MODEL
from .ray_options import add_ray_arguments, check_ray_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompts", metavar="PROMPTS",
                   help="requests in the OpenAI Batch API's JSON-lines form (custom_id, method, "
                        "url, body), or plain text with one prompt per line")
    p.add_argument("out", metavar="OUT",
                   help="results as JSON lines, one per input row in input order; an existing "
                        "OUT of the same input is continued (finished rows are skipped)")
    p.add_argument("--model", "--model_path", "--model-path", dest="model", default=None,
                   help=f"model (path, GGUF, registry name; default {DEFAULT_MODEL})")
    p.add_argument("--served-model-name", default=None,
                   help="the model's id, what a Batch API request's body.model must name "
                        "(default: MODEL as given); requests without one use it")
    p.add_argument("--chat", action="store_true",
                   help="plain-text prompts: send each as a user message through the chat "
                        "template (default: a completion of the text)")
    p.add_argument("--max-new-tokens", "--max-tokens", dest="max_tokens", type=int, default=None,
                   help="plain-text prompts: tokens generated at most (default: the model's)")
    p.add_argument("--temperature", type=float, default=None,
                   help="plain-text prompts: sampling temperature (default 0: greedy)")
    p.add_argument("--top-p", type=float, default=None, help="plain-text prompts: top-p")
    p.add_argument("--seed", type=int, default=None, help="plain-text prompts: sampling seed")
    p.add_argument("--stop", action="append", default=None,
                   help="plain-text prompts: stop string (repeatable)")
    p.add_argument("--max-concurrent-requests", type=int, default=None,
                   help="sequences generated together per engine (default 8)")
    add_ray_arguments(p, "the rows")
    EngineSettings.add_arguments(p)


def main(args: argparse.Namespace) -> int:
    import logging

    from ..progress import progress_bar
    from ..server.batch import read_rows, run_batch, run_local
    from ..server.config import ServerConfig

    check_ray_arguments(args)
    request = {k: v for k, v in dict(max_tokens=args.max_tokens, temperature=args.temperature,
                                     top_p=args.top_p, seed=args.seed, stop=args.stop).items()
               if v is not None}
    if "temperature" not in request and "top_p" not in request:
        request["temperature"] = 0
    logging.getLogger("sparsellm.server").setLevel(logging.WARNING)  # no server start-up notes
    rows = read_rows(args.prompts, chat=args.chat, request=request)
    model = args.model or DEFAULT_MODEL
    name = args.served_model_name or model
    engine = EngineSettings.given(args)
    num_cores = engine.pop("num_cores", None)
    config = ServerConfig(
        endpoints=[{"model": model, "name": name, "kwargs": engine}], num_cores=num_cores,
        max_concurrent_requests=args.max_concurrent_requests or 8, log_level="warning")
    if args.ray is None:
        runner = partial(run_local, config, name)
    else:
        from ..cluster.batch import run_on_ray

        runner = partial(run_on_ray, config, name, address=args.ray or None,
                         workers=args.workers)

    start = time.perf_counter()
    with progress_bar(len(rows), "batch", unit="row") as bar:
        summary = run_batch(rows, args.out, runner, bar)
    where = "on Ray" if args.ray is not None else "locally"
    print(f"{summary.already_done + summary.ran} of {len(rows)} rows in {args.out}: "
          f"{summary.ran} run {where} in {time.perf_counter() - start:.1f} s"
          + (f", {summary.already_done} already there" if summary.already_done else "")
          + (f"; {summary.failed} failed (their `error` says why)" if summary.failed else ""),
          file=sys.stderr)
    return 0
