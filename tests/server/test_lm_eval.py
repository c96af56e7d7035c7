"""lm-evaluation-harness (issue 31), offline on local tasks: `lm_eval --model local-completions`
against a real `sparsellm serve` process, the library integration (`evaluate(...,
integration="lm-evaluation-harness")`), and lm-eval's own `hf` backend on the same fp32 weights
(the tiny random Llama) give the same numbers."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from subprocess_env import subprocess_env

from .conftest import write_config

lm_eval = pytest.importorskip("lm_eval")

pytestmark = pytest.mark.slow
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
WORDS = ["return", "import", "self", "value", "string", "class", "def", "None", "True", "False",
         "print", "result", "text", "index", "width", "line", "quick", "brown", "fox"]
MC_ITEMS = 40
GEN_PROMPTS = ["def add(a, b):", "import os", "class Point:", "The quick brown", "return self",
               "print(", "for i in range(", "if x is None:"]


@pytest.fixture(scope="module", autouse=True)
def offline():
    patch = pytest.MonkeyPatch()
    for k, v in OFFLINE.items():
        patch.setenv(k, v)
    yield
    patch.undo()


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    """A multiple-choice task (40 items) and a generate_until task, as local YAML + jsonl."""
    folder = tmp_path_factory.mktemp("lm_eval_tasks")
    rng = random.Random(31)
    with open(folder / "mc.jsonl", "w") as f:
        for _ in range(MC_ITEMS):
            question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
            choices = [" " + w for w in rng.sample(WORDS, 4)]
            f.write(json.dumps({"question": question, "choices": choices,
                                "answer": rng.randrange(4)}) + "\n")
    (folder / "mc.yaml").write_text(f"""task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder / "mc.jsonl"}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
""")
    with open(folder / "gen.jsonl", "w") as f:
        for p in GEN_PROMPTS:
            f.write(json.dumps({"question": p, "answer": " return"}) + "\n")
    (folder / "gen.yaml").write_text(f"""task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder / "gen.jsonl"}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
""")
    return folder


def per_doc(samples: list[dict]) -> dict[int, list]:
    """doc_id -> the model's raw answers: [(loglikelihood, is_greedy) per choice] or [text]
    (sample files hold them as strings)."""
    def parse(answer):  # noqa: ANN001, ANN202
        if isinstance(answer, str):
            return answer
        return float(answer[0]), str(answer[1]) == "True"
    return {s["doc_id"]: [parse(r[0]) for r in s["resps"]] for s in samples}


def acc(results: dict, name: str) -> float:
    return results["tiny_mc"][f"{name},none"]


@pytest.fixture(scope="module")
def hf_run(tasks, tiny_llama_dir) -> dict:
    """lm-eval's own transformers backend, fp32."""
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model="hf", model_args={"pretrained": str(tiny_llama_dir), "dtype": "float32"},
        tasks=["tiny_mc", "tiny_gen"], device="cpu", batch_size=4,
        task_manager=TaskManager(include_path=str(tasks)), log_samples=True)
    return out


@pytest.fixture(scope="module")
def server_run(tasks, tiny_llama_dir, start_server, tmp_path_factory) -> dict:
    """`lm_eval --model local-completions` (a subprocess) against a real server, token-id
    prompts in batches of 4, 2 requests in flight."""
    tmp = tmp_path_factory.mktemp("lm_eval_server")
    config = write_config(tmp / "config.yaml", tiny_llama_dir, endpoints=[{
        "task": "text-generation", "model": str(tiny_llama_dir), "name": "tiny",
        "kwargs": {"sequence_length": 2048, "weights": "fp32"}}], max_concurrent_requests=4)
    server = start_server(["--config-file", str(config)])
    model_args = (f"model=tiny,base_url={server.url}/v1/completions,tokenizer_backend=huggingface,"
                  f"tokenizer={tiny_llama_dir},num_concurrent=2")
    proc = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
         model_args, "--batch_size", "4", "--tasks", "tiny_mc,tiny_gen", "--include_path",
         str(tasks), "--output_path", str(tmp / "out"), "--log_samples"],
        env={**subprocess_env(), **OFFLINE}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (results_file,) = (tmp / "out").rglob("results_*.json")
    samples = {task: [json.loads(line) for f in (tmp / "out").rglob(f"samples_{task}_*.jsonl")
                      for line in f.read_text().splitlines()]
               for task in ("tiny_mc", "tiny_gen")}
    return {"results": json.loads(results_file.read_text())["results"], "samples": samples,
            "server_log": server.output()}


def test_server_matches_hf_backend(hf_run, server_run):
    for name in ("acc", "acc_norm"):
        assert abs(acc(server_run["results"], name) - acc(hf_run["results"], name)) \
            <= 1 / MC_ITEMS + 1e-9
    ours, ref = per_doc(server_run["samples"]["tiny_mc"]), per_doc(hf_run["samples"]["tiny_mc"])
    assert sorted(ours) == sorted(ref) == list(range(MC_ITEMS))
    for doc in ref:  # every choice's loglikelihood, not just the argmax
        assert [ll for ll, _ in ours[doc]] == pytest.approx([ll for ll, _ in ref[doc]],
                                                            abs=2e-3)
    greedy_agree = sum(g1 == g2 for doc in ref for (_, g1), (_, g2) in
                       zip(ours[doc], ref[doc], strict=True))
    assert greedy_agree >= 4 * MC_ITEMS - 1


def test_generate_until_completes_through_the_server(hf_run, server_run):
    assert "exact_match,none" in server_run["results"]["tiny_gen"]
    ours, ref = per_doc(server_run["samples"]["tiny_gen"]), per_doc(hf_run["samples"]["tiny_gen"])
    assert sorted(ours) == list(range(len(GEN_PROMPTS)))
    assert all(texts and texts[0] and "\n" not in texts[0] for texts in ours.values())
    same = sum(ours[d] == ref[d] for d in ref)  # greedy: the same text as transformers
    assert same >= len(GEN_PROMPTS) - 1, (ours, ref)


def test_library_integration_matches_server_and_hf(hf_run, server_run, tasks, tiny_llama_dir):
    from sparsellm.evaluation import evaluate

    result = evaluate(tiny_llama_dir, datasets="tiny_mc,tiny_gen",
                      integration="lm-evaluation-harness", include_path=tasks, batch_size=4)
    assert result.integration == "lm-evaluation-harness" and result.tasks == ["tiny_mc",
                                                                              "tiny_gen"]
    assert result.samples == MC_ITEMS + len(GEN_PROMPTS)
    for name in ("acc", "acc_norm"):
        ours = acc(result.results, name)
        assert abs(ours - acc(hf_run["results"], name)) <= 1 / MC_ITEMS + 1e-9
        assert abs(ours - acc(server_run["results"], name)) <= 1 / MC_ITEMS + 1e-9
    assert result.results["tiny_gen"]["exact_match,none"] == \
        server_run["results"]["tiny_gen"]["exact_match,none"]
    json.loads(result.to_json())  # serializable
    print(f"tiny_mc acc/acc_norm: hf {acc(hf_run['results'], 'acc'):.4f}/"
          f"{acc(hf_run['results'], 'acc_norm'):.4f}, server "
          f"{acc(server_run['results'], 'acc'):.4f}/{acc(server_run['results'], 'acc_norm'):.4f}"
          f", library {acc(result.results, 'acc'):.4f}/{acc(result.results, 'acc_norm'):.4f}")
