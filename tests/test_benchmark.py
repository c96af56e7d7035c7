"""`sparsellm benchmark` run as a user would (a subprocess), and the Python functions behind it:
sparsellm.benchmark.benchmark, benchmark_compare and compare_report (speculative decoding over a
prompt set: test_speculation_benchmark.py). Tiny random models only, measured for a fraction of
a second."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import pytest

from sparsellm.benchmark import (
    BenchmarkResult,
    benchmark,
    benchmark_compare,
    compare_report,
)
from test_cli_commands import sparsellm  # the CLI in a subprocess

PROMPT, GENERATED = 4, 6
# later flags override these (argparse keeps the last value)
FAST = ["--time", "0.3", "--warmup-time", "0.1", "--generated-tokens", str(GENERATED),
        "--input-ids-length", str(PROMPT)]
API_FAST = dict(input_ids_length=PROMPT, generated_tokens=GENERATED, time_limit=0.2,
                warmup_time=0.05, progress=False)

REPORT_ROWS = ["Original Model Path", "Weights", "KV Cache", "Batch Size", "Scenario", "Threads",
               "Prompt / Generated Tokens", "Throughput (items/sec)", "Latency Mean (ms/token)",
               "Latency Median (ms/token)", "Latency 90th Percentile (ms/token)",
               "Prefill (tokens/sec)", "Time To First Token (ms)",
               "Weights Read Per Decode Step (MB)", "Achieved Bandwidth (GB/s)",
               "Time Outside Native Forward (%)", "RSS / Peak RSS (MB)", "Iterations / Seconds",
               "End-to-end (generated tokens/sec)"]


def parse_reports(stdout: str) -> list[dict[str, str]]:
    """The `Key   : value` blocks of BenchmarkResult.report(), one dict per report."""
    reports: list[dict[str, str]] = []
    for line in stdout.splitlines():
        m = re.fullmatch(r"(\S.*?) +: (.*)", line)
        if m is None:
            continue
        key, value = m.groups()
        if key == "Original Model Path":
            reports.append({})
        assert reports, f"report row before 'Original Model Path': {line!r}"
        reports[-1][key] = value
    return reports


def linear_weight_count(model_dir: Path) -> int:
    """Weights in the linear layers (every 2-D tensor but the embedding), lm_head included."""
    from safetensors.numpy import load_file

    tensors = load_file(model_dir / "model.safetensors")
    return sum(t.size for name, t in tensors.items() if t.ndim == 2 and "embed" not in name)


def check_result_dict(d: dict, *, batch_size: int, scenario: str, kv_cache_dtype: str) -> None:
    """Invariants every BenchmarkResult.to_dict() from a FAST run must satisfy."""
    assert d["batch_size"] == batch_size and d["scenario"] == scenario
    assert d["kv_cache_dtype"] == kv_cache_dtype
    assert d["input_ids_length"] == PROMPT and d["generated_tokens"] == GENERATED
    assert d["sequence_length"] == PROMPT + GENERATED  # the default: prompt + generated
    assert d["num_cores"] >= 1
    assert d["iterations"] >= 1
    for key in ["throughput", "latency_mean_ms", "latency_median_ms", "latency_p90_ms",
                "prefill_tokens_per_s", "time_to_first_token_ms", "bandwidth_gbs", "rss_mb",
                "peak_rss_mb", "seconds"]:
        assert math.isfinite(d[key]) and d[key] > 0, (key, d[key])
    assert d["latency_median_ms"] <= d["latency_p90_ms"]
    # a share of the measured decode time: some Python runs around every native forward
    assert 0 < d["outside_native_pct"] < 100
    assert d["weight_bytes_per_step"] > 0
    # bandwidth is weight bytes per step over the mean step time
    assert d["bandwidth_gbs"] == pytest.approx(
        d["weight_bytes_per_step"] / (d["latency_mean_ms"] / 1000) / 1e9, rel=1e-9)
    # every stream runs to exactly GENERATED tokens (force_max_tokens) and the measurement
    # finishes what is in flight, so end-to-end = iterations * GENERATED / seconds
    end_to_end = float(d["extra"]["End-to-end (generated tokens/sec)"])
    assert end_to_end == pytest.approx(d["iterations"] * GENERATED / d["seconds"], abs=0.01)
    if scenario == "sync":  # whole batches start and finish together
        assert d["iterations"] % batch_size == 0


def check_report_matches(report: dict[str, str], d: dict) -> None:
    """The printed report shows the very numbers of the exported result."""
    assert list(report) == REPORT_ROWS
    assert report["Original Model Path"] == d["model"]
    assert report["Weights"] == d["weights"]
    assert report["KV Cache"] == d["kv_cache_dtype"]
    assert report["Batch Size"] == str(d["batch_size"])
    assert report["Scenario"] == d["scenario"]
    assert report["Threads"] == str(d["num_cores"])
    assert report["Prompt / Generated Tokens"] == f"{PROMPT} / {GENERATED}"
    assert report["Throughput (items/sec)"] == f"{d['throughput']:.2f}"
    assert report["Latency Mean (ms/token)"] == f"{d['latency_mean_ms']:.2f}"
    assert report["Latency Median (ms/token)"] == f"{d['latency_median_ms']:.2f}"
    assert report["Latency 90th Percentile (ms/token)"] == f"{d['latency_p90_ms']:.2f}"
    assert report["Prefill (tokens/sec)"] == f"{d['prefill_tokens_per_s']:.1f}"
    assert report["Time To First Token (ms)"] == f"{d['time_to_first_token_ms']:.1f}"
    assert report["Weights Read Per Decode Step (MB)"] == f"{d['weight_bytes_per_step'] / 1e6:.1f}"
    assert report["Achieved Bandwidth (GB/s)"] == f"{d['bandwidth_gbs']:.1f}"
    assert report["Time Outside Native Forward (%)"] == f"{d['outside_native_pct']:.1f}"
    assert report["RSS / Peak RSS (MB)"] == f"{d['rss_mb']:.0f} / {d['peak_rss_mb']:.0f}"
    assert report["Iterations / Seconds"] == f"{d['iterations']} / {d['seconds']:.1f}"
    # and the printed numbers themselves parse and are sane
    for key in ["Throughput (items/sec)", "Prefill (tokens/sec)",
                "Weights Read Per Decode Step (MB)"]:
        assert float(report[key]) > 0, (key, report[key])
    for key in ["Latency Mean (ms/token)", "Latency Median (ms/token)",
                "Latency 90th Percentile (ms/token)", "Time To First Token (ms)",
                "Achieved Bandwidth (GB/s)"]:  # tiny model: may round to 0.0
        assert math.isfinite(float(report[key])) and float(report[key]) >= 0, (key, report[key])
    rss, peak = (int(x) for x in report["RSS / Peak RSS (MB)"].split(" / "))
    assert rss > 0 and peak > 0
    iterations, seconds = report["Iterations / Seconds"].split(" / ")
    assert int(iterations) >= 1 and float(seconds) > 0


def run_json(tmp_path: Path, *args: str) -> tuple[str, list | dict]:
    """Run `sparsellm benchmark ARGS --export-json FILE`; return (stdout, the exported JSON)."""
    out = tmp_path / "bench.json"
    r = sparsellm("benchmark", *args, "--export-json", str(out))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "Warning" not in r.stderr, r.stderr
    return r.stdout, json.loads(out.read_text())


# ---- the CLI -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def default_run(tiny_llama_dir, tmp_path_factory) -> tuple[str, list]:
    """`sparsellm benchmark TINY` with default options (sync, batch 1, fp32), run once."""
    return run_json(tmp_path_factory.mktemp("bench"), str(tiny_llama_dir), *FAST)


def test_cli_prints_deepsparse_style_report(default_run, tiny_llama_dir):
    stdout, results = default_run
    reports = parse_reports(stdout)
    assert len(reports) == 1, stdout
    assert stdout.splitlines()[0].startswith("Original Model Path")
    report = reports[0]
    assert report["Original Model Path"] == str(tiny_llama_dir)
    assert report["Batch Size"] == "1" and report["Scenario"] == "sync"
    assert report["KV Cache"] == "fp32"
    assert report["Weights"] == "fp32 x15"  # 2 layers x (q k v o gate up down) + lm_head
    check_report_matches(report, results[0])


def test_cli_export_json(default_run, tiny_llama_dir):
    _, results = default_run
    assert isinstance(results, list) and len(results) == 1
    d = results[0]
    assert set(d) == set(BenchmarkResult.__dataclass_fields__)
    assert d["model"] == str(tiny_llama_dir) and d["weights"] == "fp32 x15"
    check_result_dict(d, batch_size=1, scenario="sync", kv_cache_dtype="fp32")
    # documented: every linear weight as stored (fp32: 4 bytes each) is read once per step
    assert d["weight_bytes_per_step"] == 4 * linear_weight_count(tiny_llama_dir)
    assert d["peak_rss_mb"] >= d["rss_mb"]
    assert d["round_throughputs"] == [d["throughput"]]  # one round without --compare


def test_cli_batch_scenario_kv_cache_and_weights_options(default_run, tiny_llama_dir, tmp_path):
    stdout, results = run_json(tmp_path, str(tiny_llama_dir), *FAST, "--batch-size", "2",
                               "--scenario", "async", "--kv-cache-dtype", "fp16",
                               "--weights", "int8_a8")
    (report,) = parse_reports(stdout)
    (d,) = results
    assert report["Batch Size"] == "2" and report["Scenario"] == "async"
    assert report["KV Cache"] == "fp16" and report["Weights"] == "int8_a8"
    assert d["weights"] == "int8_a8"
    check_result_dict(d, batch_size=2, scenario="async", kv_cache_dtype="fp16")
    check_report_matches(report, d)
    # int8: one byte per weight plus per-row scales, about a quarter of fp32
    n = linear_weight_count(tiny_llama_dir)
    assert n <= d["weight_bytes_per_step"] < 1.25 * n
    assert d["weight_bytes_per_step"] < default_run[1][0]["weight_bytes_per_step"] / 3


def test_cli_sync_batch_of_two(tiny_llama_dir, tmp_path):
    stdout, (d,) = run_json(tmp_path, str(tiny_llama_dir), *FAST, "-b", "2", "-s", "sync",
                            "--sequence-length", "32")
    (report,) = parse_reports(stdout)
    assert d["sequence_length"] == 32
    d["sequence_length"] = PROMPT + GENERATED  # the only setting that differs from FAST's
    check_result_dict(d, batch_size=2, scenario="sync", kv_cache_dtype="fp32")
    check_report_matches(report, d)


def test_cli_compare_prints_both_reports_and_ratios(tiny_llama_dir, tiny_model_dir, tmp_path):
    other = tiny_model_dir("llama_tied")
    stdout, results = run_json(tmp_path, str(tiny_llama_dir), *FAST, "--compare", str(other),
                               "--rounds", "3")
    reports = parse_reports(stdout)
    assert [r["Original Model Path"] for r in reports] == [str(tiny_llama_dir), str(other)]
    assert [d["model"] for d in results] == [str(tiny_llama_dir), str(other)]
    for report, d in zip(reports, results, strict=True):
        check_result_dict(d, batch_size=1, scenario="sync", kv_cache_dtype="fp32")
        check_report_matches(report, d)
    a, b = results
    # 3 alternating rounds of 0.1 s each (at least one whole iteration), all recorded
    assert len(a["round_throughputs"]) == len(b["round_throughputs"]) == 3
    for d in results:
        assert all(t > 0 for t in d["round_throughputs"])
        assert d["seconds"] >= 0.3 * 0.99
    rounds = [y / x for x, y in zip(a["round_throughputs"], b["round_throughputs"], strict=True)]
    tail = stdout.rstrip("\n").split("\n\n")[-1].splitlines()
    assert tail == [
        f"{other} vs {tiny_llama_dir} (same process, same settings):",
        f"  decode throughput {b['throughput']:.1f} vs {a['throughput']:.1f} tok/s: "
        f"{b['throughput'] / a['throughput']:.2f}x",
        f"  decode ratio per round: median {statistics.median(rounds):.2f}x (min "
        f"{min(rounds):.2f}x, max {max(rounds):.2f}x) over 3 interleaved rounds",
        f"  prefill {b['prefill_tokens_per_s']:.0f} vs {a['prefill_tokens_per_s']:.0f} tok/s: "
        f"{b['prefill_tokens_per_s'] / a['prefill_tokens_per_s']:.2f}x",
        f"  weights read per step {b['weight_bytes_per_step'] / 1e6:.1f} vs "
        f"{a['weight_bytes_per_step'] / 1e6:.1f} MB",
    ]
    assert tail == compare_report(BenchmarkResult(**a), BenchmarkResult(**b)).splitlines()


@pytest.mark.parametrize("args,message", [
    (["--generated-tokens", "0"], "generated_tokens must be >= 1, got 0"),
    (["--input-ids-length", "0"], "input_ids_length must be >= 1, got 0"),
    (["--batch-size", "0"], "batch_size must be >= 1, got 0"),
    (["--input-ids-length", "100", "--sequence-length", "16"],
     f"input_ids_length + generated_tokens (100 + {GENERATED}) exceeds sequence_length (16)"),
    (["--weights", "int3"], "unknown weights format 'int3'; accepted: fp32, "),
])
def test_errors_exit_2_with_one_clear_line(args, message, tiny_llama_dir):
    r = sparsellm("benchmark", str(tiny_llama_dir), *FAST,
                  *[a.replace("{tiny}", str(tiny_llama_dir)) for a in args])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("sparsellm benchmark: error: ") and message in lines[0]
    assert r.stdout == ""


def test_missing_model_path_exits_2():
    r = sparsellm("benchmark", "/no/such/model", *FAST)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(
        "sparsellm benchmark: error: model path '/no/such/model' does not exist")


def test_missing_compare_model_exits_2_before_measuring(tiny_llama_dir):
    r = sparsellm("benchmark", str(tiny_llama_dir), *FAST, "--compare", "/no/such/model2")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "model path '/no/such/model2' does not exist" in lines[0]
    assert r.stdout == ""  # both models load before either is measured


@pytest.mark.parametrize("args,message", [
    (["--scenario", "bogus"], "argument --scenario/-s: invalid choice: 'bogus'"),
    (["--kv-cache-dtype", "int4"], "argument --kv-cache-dtype: invalid choice: 'int4'"),
])
def test_argparse_errors_exit_2(args, message, tiny_llama_dir):
    r = sparsellm("benchmark", str(tiny_llama_dir), *FAST, *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("sparsellm benchmark: error: ") and message in last
    assert r.stderr.startswith("usage: sparsellm benchmark")


@pytest.mark.parametrize("flag,value", [("--time", "0"), ("--time", "-1"),
                                        ("--warmup-time", "-1")])
def test_a_time_that_measures_nothing_is_an_error(tiny_llama_dir, flag, value):
    r = sparsellm("benchmark", str(tiny_llama_dir), *FAST, flag, value)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("sparsellm benchmark: error: time must be > 0")


# ---- the Python API ------------------------------------------------------------------------------
def test_benchmark_api_result(tiny_llama_dir):
    result = benchmark(tiny_llama_dir, **API_FAST)
    assert isinstance(result, BenchmarkResult)
    assert result.model == str(tiny_llama_dir) and result.weights == "fp32 x15"
    d = result.to_dict()
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    check_result_dict(d, batch_size=1, scenario="sync", kv_cache_dtype="fp32")
    assert result.iterations >= 1
    assert result.peak_rss_mb >= result.rss_mb > 0
    assert result.seconds >= API_FAST["time_limit"]  # it stops only once the time is up
    assert result.weight_bytes_per_step == 4 * linear_weight_count(tiny_llama_dir)
    report = parse_reports(result.report())
    assert len(report) == 1
    check_report_matches(report[0], d)


@pytest.mark.parametrize("kv", ["fp16", "int8"])
def test_benchmark_api_batch_and_num_cores(tiny_llama_dir, kv):
    result = benchmark(tiny_llama_dir, batch_size=3, scenario="sync", num_cores=1,
                       kv_cache_dtype=kv, **API_FAST)
    assert result.num_cores == 1
    check_result_dict(result.to_dict(), batch_size=3, scenario="sync", kv_cache_dtype=kv)


@pytest.mark.parametrize("kwargs,message", [
    (dict(scenario="bogus"), "unknown scenario 'bogus'; accepted: sync, async"),
    (dict(batch_size=0), "batch_size must be >= 1, got 0"),
    (dict(generated_tokens=0), "generated_tokens must be >= 1, got 0"),
    (dict(input_ids_length=-1), "input_ids_length must be >= 1, got -1"),
    (dict(sequence_length=8), r"input_ids_length \+ generated_tokens \(4 \+ 6\) exceeds "
                              r"sequence_length \(8\)"),
])
def test_benchmark_api_rejects_bad_settings(kwargs, message, tiny_llama_dir):
    with pytest.raises(ValueError, match=message):
        benchmark(tiny_llama_dir, **{**API_FAST, **kwargs})


def test_benchmark_compare_api_interleaves_rounds(tiny_llama_dir):
    a, b = benchmark_compare(tiny_llama_dir, tiny_llama_dir, rounds=4, batch_size=2,
                             kv_cache_dtype="fp16", **API_FAST)
    for r in (a, b):
        check_result_dict(r.to_dict(), batch_size=2, scenario="sync", kv_cache_dtype="fp16")
        assert len(r.round_throughputs) == 4 and all(t > 0 for t in r.round_throughputs)
        assert r.seconds >= API_FAST["time_limit"]  # 4 rounds of time_limit / 4
    assert "over 4 interleaved rounds" in compare_report(a, b)


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(rounds=0), ValueError, "rounds must be >= 1, got 0"),
    (dict(scenario="bogus"), ValueError, "unknown scenario 'bogus'"),
    (dict(bogus=1), TypeError, "bogus"),
])
def test_benchmark_compare_api_rejects_bad_settings(kwargs, error, message, tiny_llama_dir):
    with pytest.raises(error, match=message):
        benchmark_compare(tiny_llama_dir, tiny_llama_dir, **{**API_FAST, **kwargs})


def _result(model: str, throughput: float, prefill: float, weight_bytes: int) -> BenchmarkResult:
    return BenchmarkResult(
        model=model, weights="fp32 x15", batch_size=1, scenario="sync", num_cores=1,
        input_ids_length=PROMPT, generated_tokens=GENERATED, sequence_length=PROMPT + GENERATED,
        throughput=throughput, latency_mean_ms=1.0, latency_median_ms=1.0, latency_p90_ms=1.0,
        prefill_tokens_per_s=prefill, time_to_first_token_ms=1.0,
        weight_bytes_per_step=weight_bytes, bandwidth_gbs=1.0, outside_native_pct=1.0,
        rss_mb=1.0, peak_rss_mb=1.0,
        iterations=1, seconds=1.0)


def test_compare_report_format():
    a = _result("dense", throughput=100.0, prefill=1000.0, weight_bytes=4_000_000)
    b = _result("sparse", throughput=250.0, prefill=500.0, weight_bytes=1_000_000)
    assert compare_report(a, b) == (
        "sparse vs dense (same process, same settings):\n"
        "  decode throughput 250.0 vs 100.0 tok/s: 2.50x\n"
        "  prefill 500 vs 1000 tok/s: 0.50x\n"
        "  weights read per step 1.0 vs 4.0 MB")
    zero = _result("zero", throughput=0.0, prefill=0.0, weight_bytes=0)
    lines = compare_report(zero, b).splitlines()
    assert lines[1].endswith("tok/s: n/a") and lines[2].endswith("tok/s: n/a")
