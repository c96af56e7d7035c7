"""The soak script (`python -m sparsellm.server.soak`, issue 55 item 4): its verdict, and a short
run of the whole script (it starts its own `sparsellm serve` of the tiny model) as CI's smoke
version of the 2,000-request soak in docs/testing.md."""

from __future__ import annotations

import json

import pytest

from sparsellm.server.soak import KINDS, MALFORMED, SoakResult, logged_errors, main, plan
from subprocess_env import subprocess_env


def result(**changes) -> SoakResult:
    fields = dict(requests=10, concurrency=2, seconds=1.0, statuses={200: 8, 400: 2},
                  kinds={"completion": 8, "malformed": 2}, rss_start_mb=100.0,
                  baseline_answers=5, rss_baseline_mb=200.0, rss_peak_mb=230.0,
                  rss_end_mb=215.0, latency_p50=0.1, latency_p99=0.5, server_disconnects=3,
                  server_stream_errors=0, still_running=0)
    return SoakResult(**{**fields, **changes})


def test_verdict_names_5xx_broken_answers_and_memory_growth():
    assert result().problems() == []
    assert result(statuses={200: 8, 503: 2}).problems() == []  # deliberate: overload, shutdown
    (five,) = result(statuses={200: 7, 500: 2, 503: 1}).problems()
    assert five.startswith("2 responses with a 5xx status")
    (broken,) = result(failures=["completion_stream: stream ended without [DONE]"]).problems()
    assert "1 answers broke their contract" in broken and "[DONE]" in broken
    (grew,) = result(rss_end_mb=221.0).problems()
    assert grew == "RSS grew 10.5% from the first 5 answers to the end (200 -> 221 MB)"
    assert result(rss_end_mb=221.0).problems(rss_tolerance=0.2) == []
    assert len(result(rss_baseline_mb=float("nan")).problems()) == 1  # memory never read
    (streams,) = result(server_stream_errors=2).problems()
    assert streams == "the server sent 2 errors inside streams"
    (running,) = result(still_running=1).problems()
    assert running.startswith("1 requests still in the server's slots or queue")
    (logged,) = result(server_log_errors=["ERROR:    Exception in ASGI application"]).problems()
    assert logged == "the server logged 1 errors, e.g. ERROR:    Exception in ASGI application"


def test_logged_errors_are_ours_and_uvicorns():
    log = ("WARNING:     sparsellm.server: drain timeout\n"
           "ERROR:     sparsellm.server: error while streaming\nTraceback (most recent call "
           "last):\n  File \"x.py\"\nERROR:    Exception in ASGI application\nINFO: ok\n")
    assert logged_errors(log) == ["ERROR:     sparsellm.server: error while streaming",
                                  "Traceback (most recent call last):",
                                  "ERROR:    Exception in ASGI application"]


def test_plan_is_seeded_and_mixes_every_kind():
    assert plan(60, 0) == plan(60, 0) != plan(60, 1)
    assert set(plan(60, 0)) == set(KINDS)
    assert all(route.startswith("/") for route, _, _ in MALFORMED)


@pytest.mark.slow
def test_soak_smoke_run(tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])  # the server's import path
    out = tmp_path / "soak.json"
    # RSS within 25% (not 10%): 30 answers of a ~90 MB process are too few to settle
    status = main(["--model", str(tiny_llama_dir), "--requests", "60", "--concurrency", "16",
                   "--rss-tolerance", "0.25", "--json", str(out)])
    r = json.loads(out.read_text())
    print(r)
    assert status == 0
    statuses = {int(k): v for k, v in r["statuses"].items()}
    assert sum(statuses.values()) == 60 and r["failures"] == [] == r["server_log_errors"]
    assert statuses[200] > 0 and sum(v for k, v in statuses.items() if 400 <= k < 500) \
        >= r["kinds"]["malformed"]
    assert not any(k >= 500 for k in statuses)
    assert r["client_left"] >= r["kinds"]["disconnect_stream"]  # each drops its stream
    assert r["server_disconnects"] >= r["kinds"]["disconnect_stream"]  # and the server saw it
    assert r["still_running"] == 0 == r["server_stream_errors"]
    assert 0 < r["rss_start_mb"] <= r["rss_peak_mb"] and r["rss_baseline_mb"] > 0
    assert 0 < r["latency_p50"] <= r["latency_p99"]
