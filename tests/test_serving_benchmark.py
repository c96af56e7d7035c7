"""benchmarks/serving.py, the harness's serving table: its prompts and server command lines, and
its core run on ours only (real `sparsellm serve` processes on the tiny random Llama), down to
the record render.py's serving table reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from subprocess_env import subprocess_env

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import render  # noqa: E402 -- benchmarks/ scripts, importable once it is on sys.path
import serving  # noqa: E402
from records import write_record  # noqa: E402

ROW_FIELDS = {"shape", "pair", "system", "weights", "streams", "tok_s", "ttft_p50_s",
              "ttft_p99_s", "errors", "rounds"}
ROUND_FIELDS = {"tok_s", "ttft_p50_s", "ttft_p99_s", "errors", "tokens", "seconds",
                "first_error"}


def test_prompts_are_fixed_varied_and_48_to_80_words():
    prompts = serving.make_prompts(32)
    assert prompts == serving.make_prompts(32)  # the same for every system and round
    assert len(set(prompts)) == 32
    words = [len(p.split()) for p in prompts]
    assert min(words) >= 48 and max(words) <= 80 and max(words) - min(words) >= 15, words
    assert serving.make_prompts(32, seed=1) != prompts


def test_both_servers_get_the_slots_threads_and_context_per_sequence():
    ours = serving.server_command("sparsellm", Path("m"), "int4_g32", 5000, 2, 16, 192, 32, None)
    assert ours[:4] == [sys.executable, "-m", "sparsellm.cli", "serve"]
    for flag, value in (("--weights", "int4_g32"), ("--port", "5000"), ("--num-cores", "2"),
                        ("--max-concurrent-requests", "16"), ("--sequence-length", "192"),
                        ("--max-queue", "32")):
        assert ours[ours.index(flag) + 1] == value, flag
    ik = serving.server_command("ik_llama", Path("m.gguf"), "Q4_0", 5001, 2, 16, 192, 32,
                                Path("/tmp/ik"))
    assert ik[0] == "/tmp/ik/build/bin/llama-server" and "-rtr" in ik
    for flag, value in (("-t", "2"), ("-np", "16"), ("-c", str(16 * 192)), ("-fa", "on"),
                        ("--port", "5001"), ("-m", str(Path("m.gguf").resolve()))):
        assert ik[ik.index(flag) + 1] == value, flag  # llama-server splits -c between slots


@pytest.mark.slow
def test_ours_only_run_gives_rows_the_serving_table_renders(tiny_llama_dir, tmp_path,
                                                             monkeypatch):
    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])  # children: this package
    requests, streams, max_tokens, rounds = 4, 2, 8, 2
    prompts = serving.make_prompts(requests)
    context = serving.sequence_tokens(tiny_llama_dir, prompts, max_tokens)
    assert context % 64 == 0 and context > max_tokens + 16
    rows = serving.measure({("sparsellm", "int8_a8"): (tiny_llama_dir, "int8_a8")},
                           shape="tiny", prompts=prompts, context=context, rounds=rounds,
                           streams=streams, max_tokens=max_tokens, threads=1)
    assert len(rows) == 1
    row = rows[0]
    assert set(row) == ROW_FIELDS
    assert (row["shape"], row["pair"], row["system"], row["weights"], row["streams"],
            row["errors"]) == ("tiny", "int8_a8", "sparsellm", "int8_a8", streams, 0)
    assert len(row["rounds"]) == rounds
    for figures in row["rounds"]:
        assert set(figures) == ROUND_FIELDS and figures["first_error"] is None
        assert figures["tokens"] == requests * max_tokens  # ignore_eos: every token asked for
        assert figures["tok_s"] == pytest.approx(figures["tokens"] / figures["seconds"])
        assert 0 < figures["ttft_p50_s"] <= figures["ttft_p99_s"] < figures["seconds"]
    for field in ("tok_s", "ttft_p50_s", "ttft_p99_s"):
        values = sorted(f[field] for f in row["rounds"])
        assert row[field] == pytest.approx(sum(values) / 2)  # the median of two rounds
    # the record, with a peer row beside ours, renders as docs/benchmarks.md's serving table
    peer = {**row, "system": "ik_llama", "weights": "Q8_0", "tok_s": row["tok_s"] / 2}
    where = {"cpu": "Test CPU", "isa": ["avx2"], "threads": 1, "cores": 2,
             "read_bandwidth_gb_s": 20.0, "kernel": "test"}
    path = write_record("serving", [row, peer], argv=["benchmarks/serving.py"], threads=1,
                        machine_info=where, extra={"rounds": rounds, "shape": "tiny"},
                        results=tmp_path)
    record = {**json.loads(path.read_text()), "file": path.name}
    table = render.serving_table(record)
    assert len(table) == 3 and table[2].startswith(
        f"| int8_a8 | ik_llama.cpp Q8_0 | {streams} | "), table
    assert "| 2.00x |" in table[2]
    assert "serving, tiny" in render.benchmarks_md([record])
