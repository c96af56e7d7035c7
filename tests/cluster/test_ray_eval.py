"""`sparsellm eval --ray`: perplexity samples and HumanEval problems spread over two Ray
workers give the local run's numbers (same tokens, same NLL up to the order of the sums, same
completions and program results)."""

from __future__ import annotations

import json

import pytest

from sparsellm.cli import main as cli
from sparsellm.cluster.evaluate import RayWorkers
from sparsellm.engine import EngineSettings
from sparsellm.evaluation import EvalSettings, evaluate, evaluate_humaneval
from sparsellm.models import load_checkpoint

pytestmark = pytest.mark.slow  # a Ray instance, replicas and workers to start

TEXTS = [" ".join(f"word{(i * 7 + j) % 23}" for j in range(3 + 9 * i)) for i in range(12)]
CHECK = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
# each prompt ends in a comment the completion (cut at its first newline) cannot leave: the
# add programs pass, the sub programs fail
PROBLEMS = [{"task_id": f"known/{op}{i}", "entry_point": f"{op}{i}", "test": CHECK,
             "prompt": f"def {op}{i}(a, b):\n    return a {sign} b  # "}
            for i in range(3) for op, sign in (("add", "+"), ("sub", "-"))]


@pytest.fixture(scope="module")
def workers(ray_cluster):
    return RayWorkers(count=2, threads=1)


def test_perplexity_on_two_workers_equals_the_local_run(workers, tiny_llama_dir):
    args = dict(datasets=TEXTS, integration="perplexity", sequence_length=32, stride=16,
                batch_size=3, num_cores=1)
    local = evaluate(str(tiny_llama_dir), **args)
    spread = evaluate(str(tiny_llama_dir), workers=workers, **args)
    assert local.tokens == spread.tokens > 400  # long samples are scored in several windows
    assert spread.nll == pytest.approx(local.nll, rel=1e-12)
    assert spread.perplexity == pytest.approx(local.perplexity, rel=1e-12)


def test_humaneval_on_two_workers_equals_the_local_run(workers, tiny_llama_dir):
    settings = EvalSettings(model="tiny", dataset="known", engine=EngineSettings(
        sequence_length=64, batch_size=2, num_cores=1))
    args = dict(max_generated_tokens=6, stop=["\n", "\r"], timeout=10)
    checkpoint = load_checkpoint(tiny_llama_dir)
    local = evaluate_humaneval(checkpoint, PROBLEMS, settings, **args)
    spread = evaluate_humaneval(checkpoint, PROBLEMS, settings, workers=workers, **args)
    assert [p["task_id"] for p in spread.problems] == [p["task_id"] for p in PROBLEMS]
    for a, b in zip(local.problems, spread.problems, strict=True):
        assert (a["completion"], a["status"], a["generated_tokens"]) == \
            (b["completion"], b["status"], b["generated_tokens"])
    assert (spread.passed, spread.failed) == (local.passed, local.failed)
    if all(p["completion"] and not set(p["completion"]) & {"\n", "\r", "\0"}
           for p in local.problems):  # the completions stayed comments
        assert (spread.passed, spread.failed) == (3, 3)


def test_eval_command_with_ray(ray_cluster, tiny_llama_dir, tmp_path, capsys):
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    base = ["eval", str(tiny_llama_dir), "--dataset", str(data), "--sequence-length", "32",
            "--num-cores", "1"]
    assert cli([*base, "--export-json", str(tmp_path / "local.json")]) == 0
    assert cli([*base, "--ray", "--workers", "2", "--export-json",
                str(tmp_path / "ray.json")]) == 0
    local, spread = (json.loads((tmp_path / f"{n}.json").read_text())[0]
                     for n in ("local", "ray"))
    assert spread["tokens"] == local["tokens"]
    assert f"{spread['perplexity']:.4f}" == f"{local['perplexity']:.4f}"
    capsys.readouterr()
    assert cli([*base, "--workers", "2"]) == 2
    assert "--workers is for --ray" in capsys.readouterr().err
    assert cli([*base, "--ray", "--integration", "lm-evaluation-harness",
                "--tasks", "x"]) == 2
    assert "lm-evaluation-harness runs in this process" in capsys.readouterr().err
