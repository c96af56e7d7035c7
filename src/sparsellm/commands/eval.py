"""`sparsellm eval MODEL [MODEL2 ...]`: perplexity, HumanEval pass@1 or lm-evaluation-harness
tasks, one row per model (per model, task and metric for lm-eval).

    sparsellm eval smollm2-135m-instruct ./pruned50-int8 --integration perplexity \\
        --dataset openai_humaneval --export-json results.json
    sparsellm eval ./pruned50-int8 --integration lm-evaluation-harness --tasks arc_easy \\
        --include_path ./my_tasks
"""

from __future__ import annotations

import argparse
import sys

from ..engine.settings import ENGINE, EngineSettings
from ..models import DEFAULT_MODEL
from .ray_options import add_ray_arguments, check_ray_arguments

PERPLEXITY_COLUMNS = [("model", 32, "<"), ("format", 24, "<"), ("PPL", 10, ">"),
                      ("tokens", 9, ">"), ("seconds", 9, ">")]
HUMANEVAL_COLUMNS = [("model", 32, "<"), ("format", 24, "<"), ("pass@1", 8, ">"),
                     ("passed", 7, ">"), ("failed", 7, ">"), ("timeouts", 9, ">"),
                     ("crashed", 8, ">"), ("seconds", 9, ">")]
HARNESS_COLUMNS = [("model", 32, "<"), ("format", 24, "<"), ("task", 20, "<"),
                   ("metric", 16, "<"), ("value", 8, ">"), ("seconds", 9, ">")]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help=f"models to compare: paths, GGUF files, registry names (default "
                   f"{DEFAULT_MODEL})")
    p.add_argument("--integration", default="perplexity",
                   help="perplexity (default), humaneval or lm-evaluation-harness (needs "
                   'pip install "sparsellm[lm-eval]")')
    p.add_argument("--tasks", nargs="+", default=None, metavar="TASK",
                   help="lm-evaluation-harness: lm-eval task names (comma-separated or several)")
    p.add_argument("--num-fewshot", "--num_fewshot", dest="num_fewshot", type=int, default=None,
                   help="lm-evaluation-harness: few-shot examples per prompt (default: the "
                   "task's)")
    p.add_argument("--include-path", "--include_path", dest="include_path", nargs="+",
                   default=None, metavar="DIR",
                   help="lm-evaluation-harness: folders of task YAML files besides lm-eval's own")
    p.add_argument("--dataset", "--datasets", default="openai_humaneval",
                   help="openai_humaneval (default), python-stdlib, a .txt/.jsonl/.json file, or "
                   "a Hugging Face dataset in the local cache")
    p.add_argument("--split", default=None, help="split of a Hugging Face dataset (default train)")
    p.add_argument("--text-column-name", nargs="+", default=None, metavar="COLUMN",
                   help="column(s) joined in order into each sample's text (perplexity; default "
                   "prompt canonical_solution for HumanEval, else text)")
    p.add_argument("--limit", type=int, default=None, help="evaluate the first N samples")
    p.add_argument("--stride", type=int, default=None,
                   help="window step for samples longer than the sequence length "
                   "(default sequence_length // 2)")
    p.add_argument("--max-generated-tokens", "--max-new-tokens", type=int, default=384,
                   help="humaneval: tokens generated per problem at most (default 384)")
    p.add_argument("--timeout", type=float, default=5.0,
                   help="humaneval: seconds allowed per program (default 5)")
    EngineSettings.add_arguments(p, ["batch_size"], defaults=dict(batch_size=4), helps=dict(
        batch_size="samples scored or generated together (default 4)"))
    EngineSettings.add_arguments(
        p, group=ENGINE, defaults=dict(prompt_processing_sequence_length=128),
        helps=dict(sequence_length="tokens per window / sequence (default: the model's "
                                   "context, max 2048)"))
    add_ray_arguments(p, "perplexity samples or HumanEval problems")
    p.add_argument("--export-json", default=None, metavar="FILE",
                   help="write the results (a JSON list, one object per model) to FILE")


def _row(columns: list[tuple[str, int, str]], values: list[str]) -> str:
    return "  ".join(f"{v:{align}{width}}" for (_, width, align), v in
                     zip(columns, values, strict=True)).rstrip()


def main(args: argparse.Namespace) -> int:
    from ..atomic import write_json_atomic
    from ..evaluation import evaluate

    harness = args.integration == "lm-evaluation-harness"
    columns = PERPLEXITY_COLUMNS if args.integration == "perplexity" else \
        HARNESS_COLUMNS if harness else HUMANEVAL_COLUMNS
    if harness and not args.tasks:
        raise ValueError("--integration lm-evaluation-harness needs --tasks (lm-eval task "
                         "names, e.g. --tasks arc_easy,hellaswag)")
    if args.tasks and not harness:
        raise ValueError("--tasks is for --integration lm-evaluation-harness; use --dataset "
                         f"with {args.integration}")
    if harness:
        try:
            import lm_eval  # noqa: F401 -- the optional extra, checked before any model loads
        except ImportError:
            print('sparsellm eval: error: --integration lm-evaluation-harness needs lm-eval: '
                  'pip install "sparsellm[lm-eval]"', file=sys.stderr)
            return 2
    check_ray_arguments(args)
    if args.ray is not None and harness:
        raise ValueError("--ray spreads perplexity and humaneval; lm-evaluation-harness runs "
                         "in this process")
    workers, num_cores = None, args.num_cores
    if args.ray is not None:
        from ..cluster.evaluate import RayWorkers

        num_cores = num_cores or 1  # each worker's engine
        workers = RayWorkers(args.ray or None, args.workers, num_cores)
    results = []
    for model in args.models or [DEFAULT_MODEL]:
        r = evaluate(
            model, datasets=args.tasks if harness else args.dataset,
            integration=args.integration, num_fewshot=args.num_fewshot,
            include_path=args.include_path,
            text_column_name=args.text_column_name, limit=args.limit, stride=args.stride,
            max_generated_tokens=args.max_generated_tokens, split=args.split,
            timeout=args.timeout, workers=workers,
            **{**EngineSettings.given(args), "num_cores": num_cores},
        )
        if not results:  # the header once the first model evaluated (errors come first)
            print(_row(columns, [name for name, _, _ in columns]), flush=True)
        results.append(r)
        if args.integration == "perplexity":
            rows = [[r.model, r.format, f"{r.perplexity:.4f}", str(r.tokens),
                     f"{r.seconds:.1f}"]]
        elif harness:
            rows = [[r.model, r.format, task, metric, f"{value:.4f}", f"{r.seconds:.1f}"]
                    for task, metric, value in r.metrics()]
        else:
            rows = [[r.model, r.format, f"{r.pass_at_1:.4f}", str(r.passed), str(r.failed),
                     str(r.timeouts), str(r.crashed), f"{r.seconds:.1f}"]]
        for values in rows:
            print(_row(columns, values), flush=True)
        if args.export_json:  # rewritten after each model, so a long run keeps partial results
            write_json_atomic(args.export_json, [x.to_dict() for x in results])
    if args.export_json:
        print(f"results written to {args.export_json}", file=sys.stderr)
    return 0
