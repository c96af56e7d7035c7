"""Evaluation results: small dataclasses that print as one summary and serialize to JSON."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True)
class EvaluationResult:
    """What every integration reports: the model, the data, the time, and the settings used."""

    integration: str
    model: str
    format: str  # container and weight formats, e.g. "gguf:fp32", "safetensors:sparse_int8"
    dataset: str
    samples: int  # samples (problems) evaluated
    seconds: float  # wall time of the evaluation, model loading excluded
    limit: int | None
    sequence_length: int
    batch_size: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def summary(self) -> str:  # the metric part of __str__; subclasses override
        return ""

    def __str__(self) -> str:
        skip = {"integration", "model", "problems"}
        settings = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                             if f.name not in skip and f.name not in self._metric_names())
        return f"{self.integration} of {self.model}: {self.summary()} ({settings})"

    def _metric_names(self) -> set[str]:
        return set()


@dataclass(kw_only=True)
class PerplexityResult(EvaluationResult):
    """Token-weighted perplexity: exp(total NLL / tokens) over the whole dataset."""

    integration: str = "perplexity"
    perplexity: float
    tokens: int  # tokens scored (every token of a sample except its first)
    nll: float  # total negative log-likelihood in nats
    columns: list[str] = field(default_factory=list)  # text columns joined in order
    stride: int | None = None  # window step for samples longer than sequence_length

    def summary(self) -> str:
        return f"perplexity {self.perplexity:.4f} over {self.tokens} tokens"

    def _metric_names(self) -> set[str]:
        return {"perplexity", "tokens", "nll"}


@dataclass(kw_only=True)
class HumanEvalResult(EvaluationResult):
    """pass@1 of greedy completions, executed in a subprocess sandbox."""

    integration: str = "humaneval"
    pass_at_1: float
    passed: int
    failed: int  # ran, but a test failed or it raised / exited before the tests finished
    timeouts: int
    crashed: int  # killed by a signal, or a non-zero exit without a Python exception
    max_generated_tokens: int
    stop: list[str] = field(default_factory=list)
    timeout: float = 0.0  # seconds allowed per program
    problems: list[dict[str, Any]] = field(default_factory=list)  # per task: status, completion

    def summary(self) -> str:
        return (f"pass@1 {self.pass_at_1:.4f} ({self.passed} passed, {self.failed} failed, "
                f"{self.timeouts} timed out, {self.crashed} crashed)")

    def _metric_names(self) -> set[str]:
        return {"pass_at_1", "passed", "failed", "timeouts", "crashed", "stop"}



@dataclass(kw_only=True)
class HarnessResult(EvaluationResult):
    """lm-evaluation-harness tasks: lm-eval's own per-task metrics ("acc,none", its stderr...)."""

    integration: str = "lm-evaluation-harness"
    tasks: list[str] = field(default_factory=list)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # task -> metric -> value
    num_fewshot: int | None = None
    lm_eval_version: str = ""

    def metrics(self) -> list[tuple[str, str, float]]:
        """(task, metric, value) of every metric but standard errors and sample counts."""
        return [(task, name.removesuffix(",none"), value)
                for task, values in self.results.items() for name, value in values.items()
                if "_stderr" not in name and name != "sample_len" and isinstance(value, int | float)
                and not isinstance(value, bool)]

    def summary(self) -> str:
        return ", ".join(f"{task} {name} {value:.4f}" for task, name, value in self.metrics())

    def _metric_names(self) -> set[str]:
        return {"results", "tasks"}
