"""`sparsellm benchmark --speculation` and sparsellm.speculation_benchmark: every drafting method
on every prompt of a prompt set, against plain greedy decode. Tiny random models, a few tokens."""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter

import pytest

from sparsellm.generation.speculative import SpeculationStats
from sparsellm.speculation_benchmark import (
    DEFAULT_PROMPTS,
    PLAIN,
    MethodResult,
    Prompt,
    SpeculationBenchmark,
    benchmark_speculation,
    read_prompts,
)
from test_cli_commands import sparsellm  # the CLI in a subprocess

TOKENS = 6
PROMPTS = [Prompt("code", "code", text="def add(a, b):"),
           Prompt("chat", "chat", messages=[{"role": "user", "content": "Say hi."}]),
           Prompt("copy", "copy", text="one two three four one two three four one two")]


# ---- prompt files --------------------------------------------------------------------------------
def test_the_shipped_prompt_set_mixes_four_kinds():
    prompts = read_prompts(DEFAULT_PROMPTS)
    assert Counter(p.kind for p in prompts) == {"code": 4, "prose": 4, "chat": 4, "copy": 4}
    assert len({p.name for p in prompts}) == len(prompts)
    # the copy-heavy prompts carry the text their answer copies
    assert all(p.messages and len(p.messages[0]["content"]) > 300
               for p in prompts if p.kind == "copy")


def test_read_prompts_json_lines_and_text(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('"plain string"\n\n{"prompt": "a", "name": "n1", "kind": "code"}\n'
                 '{"messages": [{"role": "user", "content": "hi"}]}\n')
    a, b, c = read_prompts(f)
    assert (a.text, a.name, a.kind) == ("plain string", "p.jsonl:1", "text")
    assert (b.text, b.name, b.kind, b.messages) == ("a", "n1", "code", None)
    assert c.text is None and c.messages == [{"role": "user", "content": "hi"}]
    t = tmp_path / "p.txt"
    t.write_text("first prompt\n\n{\"not\": \"json here\"}\n")
    assert [(p.text, p.name) for p in read_prompts(t)] == [
        ("first prompt", "p.txt:1"), ('{"not": "json here"}', "p.txt:3")]


@pytest.mark.parametrize("content,message", [
    ("{bad json\n", r"p.jsonl:1: not JSON"),
    ('{"prompt": "a", "messages": []}\n', r'p.jsonl:1: expected a string, \{"prompt"'),
    ('{"text": "a"}\n', "p.jsonl:1: expected"),
    ('{"prompt": 3}\n', "p.jsonl:1: expected"),
    ("[1, 2]\n", "p.jsonl:1: expected"),
    ("\n\n", "has no prompts"),
])
def test_read_prompts_rejects_bad_files(tmp_path, content, message):
    f = tmp_path / "p.jsonl"
    f.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_prompts(f)


def test_read_prompts_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "none.jsonl"))):
        read_prompts(tmp_path / "none.jsonl")


# ---- the API -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def result(tiny_llama_dir) -> SpeculationBenchmark:
    """Plain, prompt lookup, the model drafting for itself in int8_a8 ("auto") and the same
    model as a draft, each alone and behind lookup; two rounds."""
    return benchmark_speculation(tiny_llama_dir, PROMPTS, ["auto", tiny_llama_dir],
                                 generated_tokens=TOKENS, rounds=2, num_cores=1,
                                 adaptive=False, progress=False)


def test_every_method_runs_on_every_prompt_and_matches_plain_decode(result, tiny_llama_dir):
    draft = f"draft {tiny_llama_dir}"
    assert [m.method for m in result.methods] == [
        PLAIN, "prompt-lookup", "self (int8_a8)", "prompt-lookup+self (int8_a8)", draft,
        f"prompt-lookup+{draft}"]
    for m in result.methods:
        assert len(m.seconds) == len(PROMPTS) and all(s > 0 for s in m.seconds)
        assert m.identical == [True] * len(PROMPTS), m.method
    assert result.speedups(PLAIN) == [1.0] * len(PROMPTS)
    assert result.method(PLAIN).stats == SpeculationStats()
    # not adaptive: a model drafts 4 tokens every step (fewer near the budget's end); lookup
    # where it finds the last tokens earlier (a random model seldom repeats the prompt)
    for m in result.methods[1:]:
        assert m.stats.proposed > 0 and m.stats.steps > 0, m.method
    # the model drafting for itself in fp32 proposes what it would decode
    same = result.method(draft).stats
    assert same.accepted >= 0.8 * same.proposed
    assert result.kinds == ["code", "chat", "copy"]
    assert result.speedups(draft, "copy") == [result.speedups(draft)[2]]


def test_report_and_dict_agree(result):
    d = result.to_dict()
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    lines = result.report().splitlines()
    assert lines[0].startswith(f"speculative decoding of {result.model} (fp32 x")
    assert f"{len(PROMPTS)} prompts x {TOKENS} greedy tokens" in lines[0]
    assert "up to 4 drafted tokens per step, 2 rounds" in lines[0]
    assert lines[2].split() == ["method", "median", "worst", "best", "accept", "tok/step",
                                "same", "code", "chat", "copy"]
    rows = lines[3:3 + len(result.methods)]
    for row, m, md in zip(rows, result.methods, d["methods"], strict=True):
        assert row.startswith(m.method)
        values = row[len(m.method):].split()
        s = result.speedups(m.method)
        assert md["speedups"] == s
        assert values[:3] == [f"{statistics.median(s):.2f}x", f"{min(s):.2f}x", f"{max(s):.2f}x"]
        assert values[5] == f"{len(PROMPTS)}/{len(PROMPTS)}"
        assert md["speedup_median"] == statistics.median(s)
        if m.method == PLAIN:
            assert values[3:5] == ["-", "-"]
        else:
            assert values[3] == f"{m.stats.acceptance_rate:.0%}"
            assert values[4] == f"{m.stats.tokens_per_step:.2f}"
            assert md["acceptance_rate"] == m.stats.acceptance_rate
    rate = TOKENS / statistics.median(result.method(PLAIN).seconds)
    assert lines[-1] == f"plain decode: {rate:.1f} tokens/s per prompt (median, prefill included)"


def test_speedups_are_plain_time_over_method_time():
    bench = SpeculationBenchmark(
        model="m", weights="fp32", num_cores=1, generated_tokens=4, num_speculative_tokens=4,
        adaptive=True, rounds=1, prompts=[Prompt("a", "code", "x"), Prompt("b", "chat", "y")],
        methods=[MethodResult(PLAIN, [2.0, 3.0], [True, True]),
                 MethodResult("fast", [1.0, 4.0], [True, False])])
    assert bench.speedups("fast") == [2.0, 0.75]
    assert bench.speedups("fast", "chat") == [0.75]
    row = bench.report().splitlines()[4].split()
    assert row == ["fast", "1.38x", "0.75x", "2.00x", "-", "-", "1/2", "2.00x", "0.75x"]


@pytest.mark.parametrize("kwargs,message", [
    (dict(generated_tokens=0), "generated_tokens and rounds must be >= 1, got 0 and 1"),
    (dict(rounds=0), "generated_tokens and rounds must be >= 1, got 128 and 0"),
    (dict(num_speculative_tokens=0), "num_speculative_tokens must be >= 1, got 0"),
])
def test_api_rejects_bad_settings(kwargs, message, tiny_llama_dir):
    with pytest.raises(ValueError, match=message):
        benchmark_speculation(tiny_llama_dir, PROMPTS, **kwargs)


# ---- the CLI -------------------------------------------------------------------------------------
def test_cli_runs_the_shipped_prompt_set(tiny_llama_dir, tmp_path):
    out = tmp_path / "spec.json"
    r = sparsellm("benchmark", str(tiny_llama_dir), "--speculation", "--generated-tokens", "3",
                  "--num-cores", "1", "--export-json", str(out))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "Warning" not in r.stderr, r.stderr
    d = json.loads(out.read_text())
    assert len(d["prompts"]) == 16 and d["adaptive"] is True and d["rounds"] == 1
    methods = [m["method"] for m in d["methods"]]
    assert methods == [PLAIN, "prompt-lookup", "self (int8_a8)", "prompt-lookup+self (int8_a8)"]
    assert all(all(m["identical"]) for m in d["methods"])
    header = [ln for ln in r.stdout.splitlines() if ln.startswith("method")]
    assert header[0].split()[-4:] == ["code", "prose", "chat", "copy"]


def test_cli_prompt_file_draft_and_no_lookup(tiny_llama_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(x):\nHello there\n")
    r = sparsellm("benchmark", str(tiny_llama_dir), "--prompts", str(prompts), "--draft-model",
                  str(tiny_llama_dir), "--no-prompt-lookup", "--generated-tokens", "3",
                  "--rounds", "2", "--num-cores", "1")
    assert r.returncode == 0, r.stderr
    rows = [ln.split()[0] for ln in r.stdout.splitlines()[3:-1]]
    assert rows == [PLAIN, "draft"]
    assert "2 prompts x 3 greedy tokens" in r.stdout and "2 rounds" in r.stdout


@pytest.mark.parametrize("args,message", [
    (["--prompts", "/no/such/p.jsonl"], "prompt file '/no/such/p.jsonl' does not exist"),
    (["--speculation", "--num-speculative-tokens", "0"], "num_speculative_tokens must be >= 1"),
    (["--speculation", "--rounds", "0"], "rounds must be >= 1"),
    (["--draft-model", "/no/such/draft"], "model path '/no/such/draft' does not exist"),
    (["--speculation", "--draft-weights", "int3"], "unknown weights format 'int3'"),
])
def test_cli_errors_exit_2_with_one_clear_line(args, message, tiny_llama_dir):
    r = sparsellm("benchmark", str(tiny_llama_dir), "--generated-tokens", "2", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("sparsellm benchmark: error: ") and message in lines[0]
