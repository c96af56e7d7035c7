"""The lm-evaluation-harness integration (issue 31): the lm-eval model class against lm-eval's
own transformers backend request by request, `sparsellm eval --integration
lm-evaluation-harness` on a local task, lm-eval kept out of the runtime, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparsellm.cli import main
from subprocess_env import subprocess_env

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
TEXTS = ["def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
         "import os\nimport sys\nprint(os.getcwd(), sys.argv)\n" * 12]  # 2nd: several windows


@pytest.fixture
def offline(monkeypatch):
    for k, v in OFFLINE.items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    rows = [{"q": "def add(a, b):\n    return", "choices": [" a + b", " None", " self"], "a": 0},
            {"q": "import", "choices": [" os", " sys", " json"], "a": 1},
            {"q": "The quick brown", "choices": [" fox", " dog", " cat"], "a": 0},
            {"q": "class Point:\n    def", "choices": [" __init__", " add", " fib"], "a": 0},
            {"q": "print(", "choices": ["x)", "'hello')", "1 + 2)"], "a": 2}]
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "mc.yaml").write_text(f"""task: local_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tmp_path / "mc.jsonl"}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{q}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{a}}}}"
metric_list:
  - metric: acc
""")
    return tmp_path


def instances(kind: str, args: list[tuple]):  # noqa: ANN201
    from lm_eval.api.instance import Instance

    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


@pytest.mark.slow
def test_requests_match_lm_evals_hf_backend(tiny_llama_dir, offline):
    """loglikelihood (also with an empty context: the prefix token), loglikelihood_rolling over
    several windows, and greedy generate_until, request by request."""
    pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM

    from sparsellm.evaluation.harness import SparseLLM
    from sparsellm.pipeline import TextGeneration

    hf = HFLM(pretrained=str(tiny_llama_dir), dtype="float32", device="cpu", max_length=128,
              batch_size=2)
    ours = SparseLLM(TextGeneration(str(tiny_llama_dir), sequence_length=128, batch_size=2))
    assert ours.prefix_token_id == hf.prefix_token_id and ours.eot_token_id == hf.eot_token_id
    pairs = [("def add(a, b):\n    return", " a + b"), ("import", " os"), ("", "import os"),
             ("x = ", "1"), (TEXTS[1], " sys")]  # the last is left-truncated to 129 tokens
    for s in ("def f(x):", "<|endoftext|>import os"):
        assert ours.tok_encode(s) == hf.tok_encode(s)
    got = ours.loglikelihood(instances("loglikelihood", pairs))
    want = hf.loglikelihood(instances("loglikelihood", pairs))
    assert [g for _, g in got] == [g for _, g in want]
    assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in want], abs=1e-3)
    rolling = instances("loglikelihood_rolling", [(t,) for t in TEXTS])
    assert ours.loglikelihood_rolling(rolling) == pytest.approx(
        hf.loglikelihood_rolling(rolling), abs=2e-3)
    gen_kwargs = {"until": ["\n"], "max_gen_toks": 10, "do_sample": False}
    gens = instances("generate_until", [(p, gen_kwargs) for p in ("def add(a, b):", "import",
                                                                  "class Point:")])
    texts = ours.generate_until(gens)
    assert texts == hf.generate_until(gens)
    assert all("\n" not in t for t in texts)


@pytest.mark.slow
def test_eval_command_runs_a_local_task(tiny_llama_dir, task_dir, tmp_path, offline):
    pytest.importorskip("lm_eval")
    from sparsellm.evaluation import evaluate

    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "sparsellm.cli", "eval", str(tiny_llama_dir), "--integration",
         "lm-evaluation-harness", "--tasks", "local_mc", "--include_path", str(task_dir),
         "--export-json", str(out)],
        env={**subprocess_env(), **OFFLINE}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split() == ["model", "format", "task", "metric", "value", "seconds"]
    (row,) = lines[1:]
    assert row.split()[1:4] == ["safetensors:fp32", "local_mc", "acc"]
    (data,) = json.loads(out.read_text())
    assert data["integration"] == "lm-evaluation-harness" and data["samples"] == 5
    lib = evaluate(tiny_llama_dir, datasets=["local_mc"], integration="lm-evaluation-harness",
                   include_path=[task_dir])
    assert data["results"]["local_mc"]["acc,none"] == lib.results["local_mc"]["acc,none"]
    assert float(row.split()[4]) == pytest.approx(lib.results["local_mc"]["acc,none"], abs=1e-4)
    assert lib.metrics() == [("local_mc", "acc", lib.results["local_mc"]["acc,none"])]


def test_runtime_does_not_import_lm_eval():
    code = ("import sys, sparsellm, sparsellm.evaluation, sparsellm.pipeline, "
            "sparsellm.server.app, sparsellm.cli, sparsellm.commands.eval; "
            "print('lm_eval' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_missing_lm_eval_is_one_clear_error(tiny_llama_dir):
    code = ("import sys; sys.modules['lm_eval'] = None; from sparsellm.cli import main; "
            f"sys.exit(main(['eval', {str(tiny_llama_dir)!r}, '--integration', "
            "'lm-evaluation-harness', '--tasks', 'arc_easy']))")
    proc = subprocess.run([sys.executable, "-c", code], env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert 'pip install "sparsellm[lm-eval]"' in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--integration", "lm-evaluation-harness"], "needs --tasks"),
    (["--tasks", "arc_easy"], "--tasks is for --integration lm-evaluation-harness"),
    (["--integration", "lm-evaluation-harness", "--tasks", "local_mc", "--include_path",
      "{tmp}/missing"], "does not exist"),
    (["--integration", "lm-evaluation-harness", "--tasks", "no_such_task", "--include_path",
      "{tasks}"], "unknown lm-eval task(s) ['no_such_task']"),
    (["--integration", "lm-evaluation-harness", "--tasks", ",", "--include_path", "{tasks}"],
     "no lm-eval tasks given"),
    (["--integration", "lm-evaluation-harness", "--tasks", "local_mc", "--num_fewshot", "-1"],
     "num_fewshot must be an integer >= 0"),
])
def test_harness_errors_name_the_problem(tiny_llama_dir, task_dir, tmp_path, capsys, args,
                                         message):
    pytest.importorskip("lm_eval")
    args = [a.format(tmp=tmp_path, tasks=task_dir) for a in args]
    assert main(["eval", str(tiny_llama_dir), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparsellm eval: error:") and message in err
