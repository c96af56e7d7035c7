"""`sparsellm batch`: a file of requests through the server's routes in this process. Plain
prompts and the OpenAI Batch API form, results in input order equal to the pipeline's greedy
generations, per-row errors in OpenAI's shape, and a run killed half-way that a rerun finishes
with every row exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparsellm import Pipeline
from sparsellm.cli import main as cli
from sparsellm.server.batch import finished_rows, read_rows
from subprocess_env import subprocess_env

WORDS = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "paper", "light", "wind"]
PROMPTS = [f"{WORDS[i % 10]} {WORDS[i // 10 % 10]} {i}:" for i in range(200)]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def expected(tiny_llama_dir) -> list[str]:
    """The pipeline's greedy continuation of each prompt (no server involved)."""
    pipe = Pipeline.create(task="text-generation", model_path=str(tiny_llama_dir),
                           batch_size=8, max_generated_tokens=MAX_TOKENS)
    return pipe(PROMPTS).sequences


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("batch") / "prompts.txt"
    path.write_text("\n".join(PROMPTS[:100]) + "\n\n" + "\n".join(PROMPTS[100:]) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def batch_args(tiny_llama_dir, prompts: Path, out: Path, *extra: str) -> list[str]:
    return ["batch", str(prompts), str(out), "--model", str(tiny_llama_dir),
            "--max-new-tokens", str(MAX_TOKENS), "--max-concurrent-requests", "8", *extra]


def test_plain_prompts_in_input_order_equal_the_pipeline(tiny_llama_dir, prompts_file, expected,
                                                          tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    assert cli(batch_args(tiny_llama_dir, prompts_file, out)) == 0
    records = read_jsonl(out)
    assert [r["index"] for r in records] == list(range(200))  # the blank line is skipped
    assert [r["prompt"] for r in records] == PROMPTS
    assert [r["text"] for r in records] == expected
    assert all(r["completion_tokens"] <= MAX_TOKENS and r["prompt_tokens"] > 0 for r in records)
    assert "200 of 200 rows" in capsys.readouterr().err
    # a rerun finds everything done and runs nothing
    before = out.read_bytes()
    assert cli(batch_args(tiny_llama_dir, prompts_file, out)) == 0
    assert out.read_bytes() == before
    assert "0 run locally" in capsys.readouterr().err


def test_openai_batch_form_with_failing_rows(tiny_llama_dir, tmp_path, expected):
    rows = [
        {"custom_id": "a", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0}},
        {"custom_id": "b", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 4, "n": 2}},
        {"custom_id": "c", "method": "POST", "url": "/v1/completions",
         "body": {"model": "gpt-4o-mini", "prompt": "x", "max_tokens": 4}},
        {"custom_id": "d", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "x", "max_tokens": 10 ** 6}},
        {"custom_id": "e", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "x", "temperature": -1}},
    ]
    src = tmp_path / "requests.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    assert cli(["batch", str(src), str(out), "--model", str(tiny_llama_dir),
                "--served-model-name", "tiny"]) == 0
    a, b, c, d, e = read_jsonl(out)
    assert [r["custom_id"] for r in (a, b, c, d, e)] == list("abcde")
    assert a["id"].startswith("batch_req_") and a["error"] is None
    assert a["response"]["status_code"] == 200
    assert a["response"]["body"]["object"] == "text_completion"
    assert a["response"]["body"]["choices"][0]["text"] == expected[0]
    assert b["response"]["body"]["object"] == "chat.completion"
    assert len(b["response"]["body"]["choices"]) == 2 and b["error"] is None
    assert c["response"]["status_code"] == 404 and c["error"]["code"] == "model_not_found"
    assert d["response"]["status_code"] == 400
    assert d["error"]["code"] == "context_length_exceeded"
    assert e["response"]["status_code"] == 400 and e["error"]["param"] == "temperature"
    for r in (c, d, e):
        assert r["response"]["body"] == {"error": r["error"]}


def test_a_run_killed_half_way_is_finished_by_a_rerun(tiny_llama_dir, prompts_file, expected,
                                                       tmp_path):
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "sparsellm.cli",
           *batch_args(tiny_llama_dir, prompts_file, out, "--max-concurrent-requests", "2")]
    proc = subprocess.Popen(cmd, env=subprocess_env(), stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and \
            (not out.exists() or out.read_text().count("\n") < 60):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = out.read_text().count("\n")
    assert 60 <= done < 200, f"the run was not stopped half-way ({done} rows)"
    with out.open("a") as f:  # and as if it was killed in the middle of a line
        f.write('{"index": ' + str(done) + ', "prompt": "')
    rerun = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{done} already there" in rerun.stderr
    records = read_jsonl(out)
    assert [r["index"] for r in records] == list(range(200))
    assert [r["text"] for r in records] == expected


def test_an_output_of_another_input_is_refused(tiny_llama_dir, prompts_file, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"index": 0, "prompt": "something else", "text": ""}) + "\n")
    assert cli(batch_args(tiny_llama_dir, prompts_file, out)) == 2
    err = capsys.readouterr().err
    assert "belongs to another input" in err and "'something else'" in err
    out.write_text("not json\n")
    assert cli(batch_args(tiny_llama_dir, prompts_file, out)) == 2
    assert "line 1: not a batch result" in capsys.readouterr().err
    other = "not json\n" + '{"torn'  # a refused file is left as it was, torn line included
    out.write_text(other)
    assert cli(batch_args(tiny_llama_dir, prompts_file, out)) == 2
    assert out.read_text() == other


@pytest.mark.parametrize("line, message", [
    ('{"custom_id": "a", "url": "/v1/embeddings", "body": {}}', "url '/v1/embeddings' is not"),
    ('{"custom_id": "a", "url": "/v1/completions", "body": {"stream": true}}',
     "stream is not supported"),
    ('{"url": "/v1/completions", "body": {}}', "custom_id must be a non-empty string"),
    ('{"custom_id": "a", "url": "/v1/completions", "body": []}', "body must be a JSON object"),
    ('{"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}}',
     "method must be POST"),
    ('{"custom_id": "a", "url": "/v1/completions", "body": {}, "extra": 1}',
     "unknown fields ['extra']"),
    ('{"custom_id": "a", "url": "/v1/completions", "body": {}}\n{"custom_id": "a", '
     '"url": "/v1/completions", "body": {}}', "line 2: custom_id 'a' is used twice"),
    ('{"custom_id": "a", "url": "/v1/completions", "body": {}}\n{"custom_id": "b",',
     "line 2: not a JSON object"),
    ("   \n\n", "no requests (the file is empty)"),
])
def test_bad_input_files_are_refused_before_loading(tmp_path, capsys, line, message):
    src = tmp_path / "requests.jsonl"
    src.write_text(line)
    assert cli(["batch", str(src), str(tmp_path / "out.jsonl"),
                "--model", str(tmp_path / "no-such-model")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out.jsonl").exists()


def test_command_line_errors(tiny_llama_dir, prompts_file, tmp_path, capsys):
    assert cli(["batch", str(tmp_path / "missing.txt"), str(tmp_path / "o.jsonl")]) == 2
    assert "batch input" in capsys.readouterr().err
    assert cli(batch_args(tiny_llama_dir, prompts_file, tmp_path / "o.jsonl",
                          "--workers", "2")) == 2
    assert "--workers is for --ray" in capsys.readouterr().err
    assert cli(["batch", str(prompts_file), str(tmp_path / "o.jsonl"),
                "--model", str(tmp_path / "no-such-model")]) == 2
    assert "no-such-model" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_chat_prompts_and_a_torn_line(tiny_llama_dir, tmp_path):
    src = tmp_path / "p.txt"
    src.write_text("hello\nhow are you\n")
    rows = read_rows(src, chat=True, request={"max_tokens": 3})
    assert [r.url for r in rows] == ["/v1/chat/completions"] * 2
    assert rows[1].body == {"max_tokens": 3, "messages": [{"role": "user",
                                                           "content": "how are you"}]}
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"index": 0, "prompt": "hello"}) + "\n" + '{"index": 1, "pro')
    assert finished_rows(out, rows) == 1
    assert out.read_text().count("\n") == 1 and out.read_text().endswith("}\n")
