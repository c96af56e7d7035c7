"""`sparsellm eval`: one row per model, JSON export, one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparsellm.cli import main
from subprocess_env import subprocess_env


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "data.jsonl"
    rows = [{"text": "def add(a, b):\n    return a + b\n", "extra": "x"},
            {"text": "The quick brown fox jumps over the lazy dog.\n", "extra": "y"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_eval_command_in_a_subprocess(tiny_model, dataset, tmp_path) -> None:
    out = tmp_path / "results" / "out.json"
    env = subprocess_env()
    proc = subprocess.run(
        [sys.executable, "-m", "sparsellm.cli", "eval", str(tiny_model), str(tiny_model),
         "--integration", "perplexity", "--dataset", str(dataset), "--sequence-length", "64",
         "--export-json", str(out)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split() == ["model", "format", "PPL", "tokens", "seconds"]
    assert len(lines) == 3 and all(str(tiny_model) in line for line in lines[1:])
    assert lines[1].split()[1:4] == lines[2].split()[1:4]  # same model, same numbers
    data = json.loads(out.read_text())
    assert isinstance(data, list) and len(data) == 2
    assert data[0]["integration"] == "perplexity" and data[0]["dataset"] == str(dataset)
    assert data[0]["perplexity"] > 1 and data[0]["tokens"] > 0 and data[0]["samples"] == 2
    assert float(lines[1].split()[2]) == pytest.approx(data[0]["perplexity"], abs=1e-4)
    assert not [p for p in out.parent.iterdir() if p.name != "out.json"]  # no temp file left
    assert "\r" not in proc.stderr  # no progress bar when not on a terminal


def test_eval_weights_converts_on_load(tiny_model, dataset, capsys) -> None:
    assert main(["eval", str(tiny_model), "--dataset", str(dataset), "--sequence-length", "64",
                 "--weights", "int8_a8"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[1]
    assert f"{tiny_model} [int8_a8]" in row


@pytest.mark.parametrize("args, message", [
    (["--dataset", "{tmp}/missing.jsonl"], "does not exist"),
    (["--dataset", "{data}", "--integration", "mmlu"], "unknown integration 'mmlu'"),
    (["--dataset", "{data}", "--text-column-name", "text", "nope"], "['nope'] not in the dataset"),
    (["--dataset", "{data}", "--stride", "64", "--sequence-length", "64"], "stride must be"),
    (["--dataset", "{data}", "--limit", "0"], "limit must be a positive integer"),
])
def test_bad_input_exits_2_with_one_line(tiny_model, dataset, tmp_path, capsys, args,
                                         message) -> None:
    args = [a.format(tmp=tmp_path, data=dataset) for a in args]
    assert main(["eval", str(tiny_model), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sparsellm eval: error: ") and message in err[0]


def test_bad_input_in_a_subprocess(tmp_path) -> None:
    env = subprocess_env()
    proc = subprocess.run(
        [sys.executable, "-m", "sparsellm.cli", "eval", "some-model", "--integration", "bleu"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "sparsellm eval: error: unknown integration 'bleu'; accepted: perplexity, humaneval, "
        "lm-evaluation-harness"]
