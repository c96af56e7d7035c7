"""The `sparsellm` command. Each subcommand is a module in `sparsellm.commands` with
`add_arguments(parser)` and `main(args) -> int`."""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import sys

SUBCOMMANDS = {
    "compress": "compress a model one-shot (SparseGPT, GPTQ, int8/int4) with a recipe",
    "generate": "generate text with a model, streamed to the terminal",
    "export": "write a self-contained deployment folder for a model",
    "models": "list model names and supported architectures",
    "eval": "evaluate models: perplexity on a dataset or HumanEval pass@1, one row per model",
    "benchmark": "measure decode and prefill speed, latency, memory and bandwidth",
    "serve": "serve models over HTTP: /predict, an OpenAI-compatible API and a playground",
    "batch": "generate for every row of a file (OpenAI Batch API form or one prompt per line), "
             "locally or on a Ray cluster",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparsellm", description="Fast LLM text generation on CPUs through sparsity and "
        "quantization.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in SUBCOMMANDS.items():
        module = importlib.import_module(f"sparsellm.commands.{name}")
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(run=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command != "serve":  # the server configures its own logging
        # What the library notes for the user (e.g. which format a GGUF's quantized tensors
        # run in) goes to stderr, one line each.
        logging.basicConfig(level=logging.WARNING, format="note: %(message)s")
        logging.getLogger("sparsellm").setLevel(logging.INFO)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (FileNotFoundError, ValueError) as e:  # user errors: one clear line, no traceback
        print(f"sparsellm {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        where = f": {e.filename}" if e.filename else ""
        print(f"sparsellm {args.command}: error: {e.strerror}{where}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
