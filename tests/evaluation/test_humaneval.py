"""HumanEval pass@1: generation batched through the pipeline's generator, sandboxed execution."""

from __future__ import annotations

import json

import pytest

from sparsellm.evaluation import HumanEvalResult, evaluate

PROBLEMS = [
    {"task_id": f"tiny/{i}", "prompt": f"def add{i}(a, b):\n", "entry_point": f"add{i}",
     "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}
    for i in range(5)
]


def test_humaneval_on_a_tiny_model(tiny_model) -> None:
    result = evaluate(str(tiny_model), datasets=PROBLEMS, integration="humaneval",
                      max_generated_tokens=6, batch_size=3, limit=4, timeout=5)
    assert isinstance(result, HumanEvalResult)
    assert result.samples == 4 and len(result.problems) == 4
    assert result.passed + result.failed + result.timeouts + result.crashed == 4
    assert result.pass_at_1 == result.passed / 4
    for p in result.problems:
        assert p["generated_tokens"] <= 6 and p["status"] in {"passed", "failed", "timeout",
                                                               "crashed"}
        assert p["finished_reason"] in {"stop", "length"}
    data = json.loads(result.to_json())
    for key in ("pass_at_1", "passed", "failed", "timeouts", "crashed", "max_generated_tokens",
                "stop", "timeout", "model", "format", "dataset", "seconds", "batch_size"):
        assert key in data
    assert "pass@1" in str(result)


def test_known_passing_and_failing_programs_are_counted(tiny_model) -> None:
    """A runner that marked everything failed (or passed) fails this: each prompt ends in a
    comment that the completion, cut at its first newline, cannot leave, so the program's
    outcome is known: `add` is right, `sub` is wrong."""
    from sparsellm.engine import EngineSettings
    from sparsellm.evaluation import EvalSettings, evaluate_humaneval
    from sparsellm.models import load_checkpoint

    test = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
    problems = [
        {"task_id": "known/pass", "prompt": "def add(a, b):\n    return a + b  # ",
         "entry_point": "add", "test": test},
        {"task_id": "known/fail", "prompt": "def sub(a, b):\n    return a - b  # ",
         "entry_point": "sub", "test": test},
    ]
    settings = EvalSettings(model="tiny", dataset="known",
                            engine=EngineSettings(sequence_length=64, batch_size=2))
    result = evaluate_humaneval(load_checkpoint(tiny_model), problems, settings,
                                max_generated_tokens=6, stop=["\n", "\r"], timeout=10)
    assert all(p["completion"] and not set(p["completion"]) & {"\n", "\r", "\0"}
               for p in result.problems), result.problems  # the premise: it stayed a comment
    assert [p["status"] for p in result.problems] == ["passed", "failed"], result.problems
    assert "AssertionError" in result.problems[1]["detail"]
    assert (result.passed, result.failed, result.timeouts, result.crashed) == (1, 1, 0, 0)
    assert result.pass_at_1 == 0.5


def test_batching_does_not_change_greedy_completions(tiny_model) -> None:
    runs = [evaluate(str(tiny_model), datasets=PROBLEMS, integration="humaneval",
                     max_generated_tokens=8, batch_size=b) for b in (1, 5)]
    assert [p["completion"] for p in runs[0].problems] == \
        [p["completion"] for p in runs[1].problems]


@pytest.mark.slow
def test_smollm2_humaneval_subset() -> None:
    result = evaluate("smollm2-135m-instruct", integration="humaneval", limit=8, batch_size=4)
    assert result.samples == 8 and result.dataset == "openai_humaneval"
    assert result.passed + result.failed + result.timeouts + result.crashed == 8
    # It writes code (some completions are empty: the model opens with a top-level "# Test"
    # comment, which the standard "\n#" stop string cuts).
    assert any(p["completion"].strip() for p in result.problems)
    assert result.format == "gguf:int8"  # the Q4_1 tensors' declared format
