"""`sparsellm batch --ray`: the same rows fanned out over a local Ray instance (two engines of
one thread) give exactly the local run's output, in input order; a partial output is
continued, not redone; a worker killed mid-run loses no row and repeats none."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

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


def batch_workers(ray) -> list[dict]:
    """The live `BatchWorker` actors (Ray Data's `MapWorker(MapBatches(BatchWorker))`), from
    the GCS's actor table (Ray's state API needs the dashboard, which the tests do not run)."""
    return [a for a in ray._private.state.actors().values()
            if "BatchWorker" in a["ActorClassName"] and a["State"] == "ALIVE"]


def test_a_worker_killed_mid_run_loses_no_row_and_repeats_none(
        ray_cluster, tiny_llama_dir, prompts_file, expected, tmp_path, capsys):
    """Once the first records are written, one of the two workers' processes is killed
    (SIGKILL); the run still ends with each of the 200 rows exactly once, equal to the local
    run, the killed worker restarted."""
    out = tmp_path / "ray.jsonl"
    killed: dict = {}
    stop = threading.Event()

    def kill() -> None:
        while not stop.is_set():
            rows = out.read_text().count("\n") if out.exists() else 0
            workers = batch_workers(ray_cluster) if rows else []
            if workers:
                killed.update(rows=rows, actor=workers[0]["ActorID"], pid=workers[0]["Pid"])
                os.kill(workers[0]["Pid"], signal.SIGKILL)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill, name="killer")
    killer.start()
    try:
        assert cli(batch_args(tiny_llama_dir, prompts_file, out, "--ray", "--workers", "2",
                              "--num-cores", "1")) == 0
    finally:
        stop.set()
        killer.join()
    assert killed, "the run ended before a worker could be killed"
    assert 0 < killed["rows"] < 200, killed  # the kill came mid-run
    assert "200 run on Ray" in capsys.readouterr().err
    records = read_jsonl(out)
    assert [r["index"] for r in records] == list(range(200))  # each row once, in order
    assert [r["prompt"] for r in records] == PROMPTS
    assert [r["text"] for r in records] == expected
    restarts = ray_cluster._private.state.actors(killed["actor"])["NumRestarts"]
    with capsys.disabled():
        print(f"\nbatch worker kill: pid {killed['pid']} killed after {killed['rows']} of 200 "
              f"rows were written; the worker restarted {restarts} time(s); 200 rows, each once")
    assert restarts >= 1
