"""Evaluate a model: perplexity on a dataset, HumanEval pass@1, lm-evaluation-harness tasks.

    from sparsellm import evaluate
    result = evaluate("./smollm2-pruned50-quant", datasets="openai_humaneval",
                      integration="perplexity", text_column_name=["prompt", "canonical_solution"])
    print(result)             # perplexity, tokens scored, and the settings used
    result.to_json()

The model is a path, registry name or an already loaded `Checkpoint` (so compression code can
evaluate in process). Datasets come from `sparsellm.datasets` (openai_humaneval, python-stdlib,
.txt/.jsonl/.json files, cached Hugging Face names, or a list of strings / records). With
integration="lm-evaluation-harness", `datasets` names lm-eval tasks (the optional extra
`pip install "sparsellm[lm-eval]"`; lm-eval is imported only then).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .. import datasets as ds
from ..engine import EngineSettings
from ..models import Checkpoint, load_checkpoint
from ..progress import progress_bar
from .humaneval import (
    STOP_SEQUENCES,
    Completion,
    check_problems,
    execute_completions,
    generate_completions,
)
from .perplexity import ScoreTotals, perplexity_of, plan_windows, score_token_ids, token_nll
from .result import EvaluationResult, HarnessResult, HumanEvalResult, PerplexityResult
from .sandbox import ExecutionResult, run_program, run_programs

HARNESS = "lm-evaluation-harness"
INTEGRATIONS = ("perplexity", "humaneval", HARNESS)
MAX_DEFAULT_SEQUENCE_LENGTH = 2048
DEFAULT_MAX_GENERATED_TOKENS = 384

T = TypeVar("T")


class Workers(Protocol):
    """Runs the independent parts of an evaluation (perplexity samples, HumanEval problems) in
    other processes, e.g. `sparsellm.cluster.evaluate.RayWorkers`; each part loads the model by
    its path."""

    count: int  # parts to split the work into

    def map(self, fn: Callable[..., T], args: list[tuple[Any, ...]],
            on_done: Callable[[int], None]) -> list[T]:
        """[fn(*a) for a in args], computed elsewhere; on_done(i) as part i finishes."""
        ...


__all__ = [
    "HARNESS", "INTEGRATIONS", "EvalSettings", "Workers", "EvaluationResult", "ExecutionResult",
    "HarnessResult", "HumanEvalResult",
    "PerplexityResult", "evaluate", "evaluate_humaneval", "evaluate_perplexity", "format_name",
    "perplexity_of", "plan_windows", "run_program", "run_programs", "score_token_ids",
    "token_nll",
]


def evaluate(
    model: str | Path | Checkpoint,
    datasets: str | Path | Sequence[Any] | None = None,
    integration: str = "perplexity",
    text_column_name: str | Sequence[str] | None = None,
    limit: int | None = None,
    sequence_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 4,
    max_generated_tokens: int = DEFAULT_MAX_GENERATED_TOKENS,
    split: str | None = None,
    timeout: float = 5.0,
    prompt_processing_sequence_length: int = 128,
    num_cores: int | None = None,
    weights: str | None = None,
    progress: bool | None = None,
    num_fewshot: int | None = None,
    include_path: str | Path | Sequence[str | Path] | None = None,
    workers: Workers | None = None,
    **engine_settings: Any,
) -> EvaluationResult:
    """Evaluate `model` with `integration` ("perplexity", "humaneval" or
    "lm-evaluation-harness") on `datasets` (default openai_humaneval).

    perplexity: exact token-weighted perplexity of each sample's text (`text_column_name`: a
    column or list of columns joined in order; default prompt+canonical_solution for HumanEval,
    else "text"). Tokenized with the model's default special tokens, every token after the first
    scored given those before it; PPL = exp(total NLL / total scored tokens). Samples longer than
    `sequence_length` (default: the model's context, at most 2048) are scored with a strided
    window (`stride`, default sequence_length // 2), each token once. `batch_size` samples share
    each engine step.

    humaneval: pass@1 of greedy completions (`max_generated_tokens`, HumanEval stop strings),
    `batch_size` problems generated together, each program run in a sandboxed subprocess killed
    after `timeout` seconds.

    lm-evaluation-harness: lm-eval's tasks named by `datasets` (a name, "a,b" or a list), run
    by lm-eval on the native engine (loglikelihood, rolling loglikelihood and generate_until
    requests through the generation core), `num_fewshot` examples, task YAML files from the
    folders in `include_path` besides lm-eval's own; `limit` documents per task.

    `workers` (perplexity and humaneval) splits the samples or problems into `workers.count`
    parts run elsewhere, e.g. on a Ray cluster; the numbers are a local run's (the engine is
    batch invariant: a token's logits do not depend on what shares its step).

    `weights` converts every linear weight on load (e.g. "int8_a8") instead of running the
    checkpoint's declared formats; `engine_settings` are any other `EngineSettings` fields
    (e.g. kv_cache_dtype). `limit` evaluates the first N samples; `progress` shows a
    progress bar (default: only on a terminal). Bad settings, missing files and unknown columns
    raise ValueError / FileNotFoundError before the model is loaded.
    """
    if integration not in INTEGRATIONS:
        raise ValueError(f"unknown integration {integration!r}; accepted: "
                         f"{', '.join(INTEGRATIONS)}")
    _check_positive(limit=limit, sequence_length=sequence_length, stride=stride,
                    batch_size=batch_size, max_generated_tokens=max_generated_tokens,
                    prompt_processing_sequence_length=prompt_processing_sequence_length)
    if num_fewshot is not None and (not isinstance(num_fewshot, int) or num_fewshot < 0):
        raise ValueError(f"num_fewshot must be an integer >= 0, got {num_fewshot!r}")
    engine = EngineSettings(
        model_path=str(model.path) if isinstance(model, Checkpoint) else str(model),
        batch_size=batch_size, prompt_processing_sequence_length=prompt_processing_sequence_length,
    ).replace(sequence_length=sequence_length, num_cores=num_cores, weights=weights,
              **engine_settings)
    if integration == HARNESS:
        if workers is not None:
            raise ValueError("workers split perplexity and humaneval; lm-evaluation-harness "
                             "runs in this process")
        return _evaluate_harness(model, datasets, limit=limit, num_fewshot=num_fewshot,
                                 include_path=include_path, engine=engine, progress=progress)
    datasets = "openai_humaneval" if datasets is None else datasets
    records = ds.load_records(datasets, limit=limit, split=split)
    if not records:
        raise ValueError(f"dataset {_dataset_name(datasets)} has no samples")
    if integration == "perplexity":
        texts = ds.texts_from_records(records, text_column_name)  # checks the columns
    else:
        check_problems(records)
    checkpoint = model if isinstance(model, Checkpoint) else load_checkpoint(model)
    settings = _settings(model, checkpoint, _dataset_name(datasets), engine, limit=limit,
                         progress=progress)
    if integration == "perplexity":
        return evaluate_perplexity(checkpoint, texts, settings, stride=stride,
                                   columns=ds.text_columns(records, text_column_name),
                                   workers=workers)
    return evaluate_humaneval(checkpoint, records, settings,
                              max_generated_tokens=max_generated_tokens, timeout=timeout,
                              workers=workers)


def _evaluate_harness(model: str | Path | Checkpoint, tasks: Any, *, limit: int | None,
                      num_fewshot: int | None, include_path: Any, engine: EngineSettings,
                      progress: bool | None) -> HarnessResult:
    if tasks is None:
        raise ValueError("integration 'lm-evaluation-harness' needs lm-eval task names as "
                         "`datasets` (e.g. \"hellaswag,arc_easy\")")
    from .harness import evaluate_harness, task_manager, task_names  # imports lm-eval

    names = task_names(tasks)
    manager = task_manager(names, include_path)
    checkpoint = model if isinstance(model, Checkpoint) else load_checkpoint(model)
    settings = _settings(model, checkpoint, ",".join(names), engine, limit=limit,
                         progress=progress)
    return evaluate_harness(checkpoint, names, settings, manager, num_fewshot=num_fewshot)


def _settings(model: str | Path | Checkpoint, checkpoint: Checkpoint, dataset: str,
              engine: EngineSettings, **kwargs: Any) -> EvalSettings:
    """The settings with the default sequence_length: the model's context, at most 2048."""
    if engine.sequence_length is None:
        context = int(checkpoint.args.max_position_embeddings or MAX_DEFAULT_SEQUENCE_LENGTH)
        engine = engine.replace(sequence_length=min(context, MAX_DEFAULT_SEQUENCE_LENGTH))
    label = str(model) if not isinstance(model, Checkpoint) else str(checkpoint.path)
    weights = engine.weights
    return EvalSettings(model=label + (f" [{weights}]" if weights else ""), dataset=dataset,
                        engine=engine, **kwargs)


@dataclass(frozen=True)
class EvalSettings:
    """What both integrations share: how the model runs (`engine`, its sequence_length set)
    and how its result is labelled."""

    model: str  # the result's model label
    dataset: str
    engine: EngineSettings
    limit: int | None = None
    progress: bool | None = None

    @property
    def sequence_length(self) -> int:
        assert self.engine.sequence_length is not None, "resolved by _settings"
        return self.engine.sequence_length

    @property
    def batch_size(self) -> int:
        return self.engine.batch_size

    @property
    def weights(self) -> str | None:
        return self.engine.weights

    def result_header(self, checkpoint: Checkpoint, samples: int, start: float
                      ) -> dict[str, Any]:
        """The EvaluationResult fields every result has."""
        return dict(model=self.model, format=format_name(checkpoint, self.weights),
                    dataset=self.dataset, samples=samples,
                    seconds=round(time.perf_counter() - start, 3),
                    limit=self.limit, sequence_length=self.sequence_length,
                    batch_size=self.batch_size)


def evaluate_perplexity(
    checkpoint: Checkpoint,
    texts: Sequence[str],
    settings: EvalSettings,
    *,
    stride: int | None = None,
    columns: Sequence[str] = (),
    workers: Workers | None = None,
) -> PerplexityResult:
    """Perplexity of `texts` (see the module `perplexity` for the convention)."""
    length = settings.sequence_length
    if length < 2:
        raise ValueError(f"sequence_length must be at least 2, got {length}")
    stride = length // 2 if stride is None else stride
    plan_windows(2, length, stride)  # validates the stride
    start = time.perf_counter()
    ids = [checkpoint.tokenizer.encode(t) for t in texts]
    scored = [max(0, len(i) - 1) for i in ids]
    with progress_bar(sum(scored), "scoring", "tok", settings.progress) as bar:
        if workers is None:
            totals = score_samples(checkpoint, settings, ids, stride, on_scored=bar.update)
        else:
            parts = _split(len(ids), workers.count, scored)
            totals_of = workers.map(score_samples, [
                (str(checkpoint.path), settings, [ids[i] for i in part], stride)
                for part in parts], on_done=lambda k: bar.update(sum(scored[i]
                                                                     for i in parts[k])))
            totals = ScoreTotals(sum(t.nll for t in totals_of), sum(t.tokens for t in totals_of))
    return PerplexityResult(
        **settings.result_header(checkpoint, len(texts), start),
        perplexity=perplexity_of(totals), tokens=totals.tokens, nll=totals.nll,
        columns=list(columns), stride=stride,
    )


def score_samples(model: Checkpoint | str, settings: EvalSettings, ids: Sequence[Sequence[int]],
                  stride: int, on_scored: Callable[[int], None] | None = None) -> ScoreTotals:
    """Total NLL of tokenized samples on an engine of `settings` (one part of a perplexity)."""
    from ..generation import build_stack

    checkpoint = model if isinstance(model, Checkpoint) else load_checkpoint(model)
    engine = build_stack(settings.engine, checkpoint).engine
    return score_token_ids(engine, ids, settings.sequence_length, stride, on_scored=on_scored)


def _split(n: int, parts: int, weights: Sequence[int] | None = None) -> list[list[int]]:
    """Indices 0..n-1 in at most `parts` contiguous runs of about equal total weight."""
    weights = list(weights) if weights is not None else [1] * n
    total, out, run, acc = sum(weights), [], [], 0
    for i, w in enumerate(weights):
        run.append(i)
        acc += w
        if acc * parts >= total * (len(out) + 1) and len(out) < parts - 1:
            out.append(run)
            run = []
    return [r for r in [*out, run] if r]


def evaluate_humaneval(
    checkpoint: Checkpoint,
    problems: Sequence[dict[str, Any]],
    settings: EvalSettings,
    *,
    max_generated_tokens: int = DEFAULT_MAX_GENERATED_TOKENS,
    stop: Sequence[str] = STOP_SEQUENCES,
    timeout: float = 5.0,
    workers: Workers | None = None,
) -> HumanEvalResult:
    """pass@1 of greedy completions of HumanEval-style problems (task_id, prompt, test,
    entry_point)."""
    check_problems(problems)
    start = time.perf_counter()
    if workers is None:
        completions, executions = solve_problems(checkpoint, settings, problems,
                                                 max_generated_tokens, stop, timeout)
    else:
        parts = _split(len(problems), workers.count)
        with progress_bar(len(problems), "solving", "problem", settings.progress) as bar:
            solved = workers.map(solve_problems, [
                (str(checkpoint.path), settings, [problems[i] for i in part],
                 max_generated_tokens, stop, timeout) for part in parts],
                on_done=lambda k: bar.update(len(parts[k])))
        completions = [c for part, _ in solved for c in part]
        executions = [e for _, part in solved for e in part]
    count = {s: sum(e.status == s for e in executions)
             for s in ("passed", "failed", "timeout", "crashed")}
    details = [
        {"task_id": c.task_id, "status": e.status, "detail": e.detail,
         "finished_reason": c.finished_reason, "generated_tokens": c.tokens,
         "completion": c.text}
        for c, e in zip(completions, executions, strict=True)
    ]
    return HumanEvalResult(
        **settings.result_header(checkpoint, len(problems), start),
        pass_at_1=count["passed"] / len(problems), passed=count["passed"],
        failed=count["failed"], timeouts=count["timeout"], crashed=count["crashed"],
        max_generated_tokens=max_generated_tokens, stop=list(stop), timeout=timeout,
        problems=details,
    )


def solve_problems(model: Checkpoint | str, settings: EvalSettings,
                   problems: Sequence[dict[str, Any]], max_generated_tokens: int,
                   stop: Sequence[str], timeout: float
                   ) -> tuple[list[Completion], list[ExecutionResult]]:
    """Greedy completions of `problems` and their programs' runs (one part of a HumanEval)."""
    from ..pipeline import TextGeneration

    checkpoint = model if isinstance(model, Checkpoint) else load_checkpoint(model)
    pipeline = TextGeneration(checkpoint, settings=settings.engine)
    with progress_bar(len(problems), "generating", "problem", settings.progress) as bar:
        completions = generate_completions(pipeline, problems, max_generated_tokens, stop,
                                           on_done=lambda: bar.update(1))
    with progress_bar(len(problems), "executing", "program", settings.progress) as bar:
        executions = execute_completions(problems, completions, timeout,
                                         on_result=lambda i, r: bar.update(1))
    return completions, executions


def format_name(checkpoint: Checkpoint, weights: str | None = None) -> str:
    """Container and weight formats: "gguf:int8" (a quantized GGUF's declared format),
    "safetensors:sparse_int8", "safetensors:fp32", or the `weights` every tensor is run in."""
    names = [weights] if weights else sorted({f.name for f in checkpoint.weight_formats.values()})
    return f"{checkpoint.format}:{'+'.join(names) if names else 'fp32'}"


def _dataset_name(dataset: Any) -> str:
    if isinstance(dataset, str | Path):
        return str(dataset)
    return f"<{len(dataset)} in-memory samples>"


def _check_positive(**values: int | None) -> None:
    for name, value in values.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")

