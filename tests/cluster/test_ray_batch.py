"""`sparsellm batch --ray`: the same rows fanned out over a local Ray instance (two engines of
one thread) give exactly the local run's output, in input order, and a partial output is
continued, not redone."""

from __future__ import annotations

import json

import pytest

from server.test_batch import (  # the fixtures and helpers of the local tests
    MAX_TOKENS,
    PROMPTS,
    batch_args,
    expected,
    prompts_file,
    read_jsonl,
)
from sparsellm.cli import main as cli

pytestmark = pytest.mark.slow  # a Ray instance, replicas and workers to start

__all__ = ["expected", "prompts_file"]  # the fixtures, shared with the local tests


def test_ray_run_equals_the_local_run(ray_cluster, tiny_llama_dir, prompts_file, expected,
                                      tmp_path, capsys):
    out = tmp_path / "ray.jsonl"
    assert cli(batch_args(tiny_llama_dir, prompts_file, out, "--ray", "--workers", "2",
                          "--num-cores", "1")) == 0
    assert "200 run on Ray" in capsys.readouterr().err
    records = read_jsonl(out)
    assert [r["index"] for r in records] == list(range(200))
    assert [r["prompt"] for r in records] == PROMPTS
    assert [r["text"] for r in records] == expected
    assert all(r["completion_tokens"] <= MAX_TOKENS for r in records)


def test_ray_run_continues_a_partial_output(ray_cluster, tiny_llama_dir, prompts_file, expected,
                                            tmp_path, capsys):
    out = tmp_path / "ray.jsonl"
    first = [{"index": i, "prompt": p, "text": t} for i, (p, t) in
             enumerate(zip(PROMPTS[:150], expected[:150], strict=True))]
    out.write_text("".join(json.dumps(r) + "\n" for r in first) + '{"index": 150, "pr')
    assert cli(batch_args(tiny_llama_dir, prompts_file, out, "--ray", "--num-cores", "1")) == 0
    assert "50 run on Ray" in capsys.readouterr().err
    records = read_jsonl(out)
    assert [r["index"] for r in records] == list(range(200))
    assert [r["text"] for r in records] == expected
