"""HumanEval pass@1: greedy completions generated in batches, executed in a sandbox.

Each problem's prompt (the function signature and docstring) is tokenized with the model's
default special tokens and completed greedily until a stop string that starts a new top-level
block (the stop strings HumanEval harnesses use) or `max_generated_tokens`. The program
`prompt + completion + "\\n" + test + "\\ncheck(entry_point)"` then runs in a subprocess (see
`sandbox`); pass@1 with greedy decoding is the fraction of problems whose program passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..generation import GenerationRequest
from ..pipeline import TextGeneration
from .sandbox import ExecutionResult, run_programs

STOP_SEQUENCES = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]
REQUIRED_FIELDS = ("task_id", "prompt", "test", "entry_point")


@dataclass
class Completion:
    task_id: str
    text: str
    finished_reason: str | None
    tokens: int


def check_problems(problems: Sequence[dict[str, Any]]) -> None:
    for p in problems[:1]:
        missing = [f for f in REQUIRED_FIELDS if f not in p]
        if missing:
            raise ValueError(
                f"humaneval needs problems with fields {list(REQUIRED_FIELDS)}; the dataset "
                f"lacks {missing} (it has {sorted(p)})"
            )


def generate_completions(
    pipeline: TextGeneration,
    problems: Sequence[dict[str, Any]],
    max_generated_tokens: int,
    stop: Sequence[str] = STOP_SEQUENCES,
    on_done: Callable[[], None] | None = None,
) -> list[Completion]:
    """Greedy completions, `pipeline.engine.max_sequences` problems decoded together."""
    config = pipeline.config_for(deterministic=True, max_generated_tokens=max_generated_tokens,
                                 stop=list(stop), force_max_tokens=False)
    requests = [GenerationRequest(pipeline.tokenizer.encode(p["prompt"]), config)
                for p in problems]
    if on_done:
        for r in requests:
            r.on_event = lambda event: on_done() if event.finished_reason else None
    pipeline.generator.run(requests)
    return [Completion(p["task_id"], r.text, r.finished_reason, len(r.output_ids))
            for p, r in zip(problems, requests, strict=True)]


def program_for(problem: dict[str, Any], completion: str) -> str:
    return (f"{problem['prompt']}{completion}\n{problem['test']}\n"
            f"check({problem['entry_point']})\n")


def execute_completions(
    problems: Sequence[dict[str, Any]],
    completions: Sequence[Completion],
    timeout: float,
    workers: int | None = None,
    on_result: Callable[[int, ExecutionResult], None] | None = None,
) -> list[ExecutionResult]:
    programs = [program_for(p, c.text) for p, c in zip(problems, completions, strict=True)]
    return run_programs(programs, timeout=timeout, workers=workers, on_result=on_result)
