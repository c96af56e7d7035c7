"""Benchmark generation speed: decode throughput and latency, prefill, memory, bandwidth.

Decode is memory-bound: every decode step reads every weight once, so next to tokens/s we report
the bytes of weights read per step and the bandwidth that implies (gpt-fast's habit).
"""

from __future__ import annotations

import gc
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .datasets import load_texts
from .engine import EngineSettings
from .generation import BatchGenerator, GenerationConfig, GenerationRequest, build_stack

SCENARIOS = ("sync", "async")


@dataclass
class BenchmarkResult:
    model: str
    weights: str
    batch_size: int
    scenario: str
    num_cores: int
    input_ids_length: int
    generated_tokens: int
    sequence_length: int
    throughput: float  # generated tokens/s over all streams
    latency_mean_ms: float  # per decode step (one token for each active stream)
    latency_median_ms: float
    latency_p90_ms: float
    prefill_tokens_per_s: float
    time_to_first_token_ms: float
    weight_bytes_per_step: int
    bandwidth_gbs: float  # weight bytes per decode step / mean step time
    outside_native_pct: float  # share of decode time spent outside the native forward
    rss_mb: float
    peak_rss_mb: float
    iterations: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)
    kv_cache_dtype: str = "fp32"
    # decode tok/s of each measured round (one round unless interleaved with --compare)
    round_throughputs: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def report(self) -> str:
        rows = [
            ("Original Model Path", self.model),
            ("Weights", self.weights),
            ("KV Cache", self.kv_cache_dtype),
            ("Batch Size", self.batch_size),
            ("Scenario", self.scenario),
            ("Threads", self.num_cores),
            ("Prompt / Generated Tokens", f"{self.input_ids_length} / {self.generated_tokens}"),
            ("Throughput (items/sec)", f"{self.throughput:.2f}"),
            ("Latency Mean (ms/token)", f"{self.latency_mean_ms:.2f}"),
            ("Latency Median (ms/token)", f"{self.latency_median_ms:.2f}"),
            ("Latency 90th Percentile (ms/token)", f"{self.latency_p90_ms:.2f}"),
            ("Prefill (tokens/sec)", f"{self.prefill_tokens_per_s:.1f}"),
            ("Time To First Token (ms)", f"{self.time_to_first_token_ms:.1f}"),
            ("Weights Read Per Decode Step (MB)", f"{self.weight_bytes_per_step / 1e6:.1f}"),
            ("Achieved Bandwidth (GB/s)", f"{self.bandwidth_gbs:.1f}"),
            ("Time Outside Native Forward (%)", f"{self.outside_native_pct:.1f}"),
            ("RSS / Peak RSS (MB)", f"{self.rss_mb:.0f} / {self.peak_rss_mb:.0f}"),
            ("Iterations / Seconds", f"{self.iterations} / {self.seconds:.1f}"),
        ]
        rows += [(k, v) for k, v in self.extra.items()]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}} : {v}" for k, v in rows)


def benchmark(
    model: str | Path,
    scenario: str = "sync",
    input_ids_length: int = 32,
    generated_tokens: int = 128,
    time_limit: float = 10.0,
    warmup_time: float = 2.0,
    progress: bool | None = None,
    settings: EngineSettings | None = None,
    **engine_settings: Any,
) -> BenchmarkResult:
    """Generate `generated_tokens` after `input_ids_length`-token prompts, repeatedly, for
    `time_limit` seconds (after `warmup_time` seconds of warm-up).

    sync: `batch_size` sequences start together and decode as one batch each iteration.
    async: `batch_size` concurrent streams; a finished stream is replaced at once (continuous
    batching), so the batch stays full.

    The model runs as `settings` (default: one sequence, `batch_size=1`) with
    `engine_settings` (any `EngineSettings` field: batch_size, num_cores, weights,
    kv_cache_dtype, ...) applied; sequence_length defaults to prompt + generated tokens.
    """
    _check_times(time_limit, warmup_time)
    session = _Session(model, scenario=scenario, input_ids_length=input_ids_length,
                       generated_tokens=generated_tokens, settings=settings, **engine_settings)
    session.run(warmup_time, progress=False, record=False)
    session.run(time_limit, progress=progress)
    return session.close()


def benchmark_compare(
    model: str | Path,
    model2: str | Path,
    time_limit: float = 10.0,
    warmup_time: float = 2.0,
    rounds: int = 5,
    progress: bool | None = None,
    **settings: Any,
) -> tuple[BenchmarkResult, BenchmarkResult]:
    """`benchmark` of two models loaded in one process, measured in `rounds` alternating
    rounds of `time_limit / rounds` seconds each (the first model first in even rounds), so a
    machine whose speed drifts affects both alike. `settings`: those of `benchmark`.
    Each result's `round_throughputs` pairs up round by round (see `compare_report`)."""
    _check_settings(rounds=rounds)
    _check_times(time_limit, warmup_time)
    sessions = [_Session(m, **settings) for m in (model, model2)]
    for session in sessions:
        session.run(warmup_time, progress=False, record=False)
    bar = _progress_bar(2 * time_limit, progress)
    for r in range(rounds):
        for session in (sessions if r % 2 == 0 else sessions[::-1]):
            session.run(time_limit / rounds, progress=False)
            if bar is not None:
                bar.n = min(round(sum(s.stats["seconds"] for s in sessions), 1), bar.total)
                bar.refresh()
    if bar is not None:
        bar.close()
    return sessions[0].close(), sessions[1].close()


def _check_times(time_limit: float, warmup_time: float) -> None:
    if not time_limit > 0 or not warmup_time >= 0:
        raise ValueError(f"time must be > 0 and warmup_time >= 0 seconds, got {time_limit} and "
                         f"{warmup_time}")


class _Session:
    """One model set up for benchmarking; `run` measures for a while and adds to `stats`."""

    def __init__(self, model: str | Path, scenario: str = "sync", input_ids_length: int = 32,
                 generated_tokens: int = 128, settings: EngineSettings | None = None,
                 **engine_settings: Any):
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; accepted: {', '.join(SCENARIOS)}")
        _check_settings(input_ids_length=input_ids_length, generated_tokens=generated_tokens)
        settings = (settings or EngineSettings(batch_size=1)).replace(model_path=model,
                                                                       **engine_settings)
        if settings.sequence_length is None:
            settings = settings.replace(sequence_length=input_ids_length + generated_tokens)
        if input_ids_length + generated_tokens > settings.sequence_length:
            raise ValueError(f"input_ids_length + generated_tokens ({input_ids_length} + "
                             f"{generated_tokens}) exceeds sequence_length "
                             f"({settings.sequence_length})")
        self.model, self.weights, self.scenario = model, settings.weights, scenario
        self.input_ids_length, self.sequence_length = input_ids_length, settings.sequence_length
        stack = build_stack(settings)
        self.engine, self.generator = stack.engine, stack.generator
        self.prompts = _prompts(stack.checkpoint.tokenizer, settings.batch_size,
                                input_ids_length)
        self.config = GenerationConfig(max_generated_tokens=generated_tokens,
                                       force_max_tokens=True)
        self.stats = _new_stats()
        self.rounds: list[float] = []

    def run(self, seconds: float, progress: bool | None, record: bool = True) -> None:
        stats = _run(self.generator, self.prompts, self.config, self.scenario, seconds, progress)
        if record:
            for k, v in stats.items():
                self.stats[k] += v
            self.rounds.append(stats["decode_tokens"] / max(stats["decode_s"], 1e-9))

    def close(self) -> BenchmarkResult:
        """The result of every recorded run; frees the model."""
        stats, engine = self.stats, self.engine
        steps = np.array(stats["decode_step_s"]) if stats["decode_step_s"] else np.array([np.nan])
        per_token = steps * 1000.0
        bytes_per_step = engine.weight_bytes_per_step
        rss_mb = _rss_mb()
        result = BenchmarkResult(
            model=str(self.model),
            weights=self.weights or engine.weights_description,
            batch_size=engine.max_sequences,
            scenario=self.scenario,
            num_cores=engine.num_threads,
            input_ids_length=self.input_ids_length,
            generated_tokens=self.config.max_generated_tokens,
            sequence_length=self.sequence_length,
            kv_cache_dtype=engine.kv_cache_dtype,
            throughput=stats["decode_tokens"] / max(stats["decode_s"], 1e-9),
            latency_mean_ms=float(np.mean(per_token)),
            latency_median_ms=float(np.median(per_token)),
            latency_p90_ms=float(np.percentile(per_token, 90)),
            prefill_tokens_per_s=stats["prefill_tokens"] / max(stats["prefill_s"], 1e-9),
            time_to_first_token_ms=1000.0 * float(np.mean(stats["ttft_s"])),
            weight_bytes_per_step=bytes_per_step,
            bandwidth_gbs=bytes_per_step / float(np.mean(steps)) / 1e9,
            outside_native_pct=100.0 * max(0.0, 1.0 - stats["decode_native_s"]
                                           / max(stats["decode_s"], 1e-9)),
            rss_mb=rss_mb,
            # ru_maxrss can trail /proc/self/statm by a few pages: the peak is at least the
            # current.
            peak_rss_mb=max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, rss_mb),
            iterations=stats["iterations"],
            seconds=stats["seconds"],
            extra={"End-to-end (generated tokens/sec)":
                   f"{stats['generated_tokens'] / max(stats['seconds'], 1e-9):.2f}"},
            round_throughputs=self.rounds,
        )
        self.generator = self.engine = None  # type: ignore[assignment]
        gc.collect()
        return result


def _prompts(tokenizer: Any, n: int, length: int) -> list[list[int]]:
    """Real code as prompts: the standard library's source, cut to `length` tokens each."""
    ids: list[int] = []
    for text in load_texts("python-stdlib", limit=20):
        ids += tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= n * length:
            break
    return [ids[i * length:(i + 1) * length] for i in range(n)]


def _run(generator: BatchGenerator, prompts: list[list[int]], config: GenerationConfig,
         scenario: str, seconds: float, progress: bool | None) -> dict[str, Any]:
    """Generate until `seconds` pass (finishing the iteration in flight); time each phase."""
    stats = _new_stats()
    bar = _progress_bar(seconds, progress)
    start = time.perf_counter()
    next_prompt = 0

    def submit() -> None:
        nonlocal next_prompt
        generator.add(GenerationRequest(prompts[next_prompt % len(prompts)], config))
        next_prompt += 1

    def elapsed() -> float:
        return time.perf_counter() - start

    if scenario == "async":
        for _ in prompts:
            submit()
    while elapsed() < seconds or generator.has_work:
        if scenario == "sync" and not generator.has_work:
            if elapsed() >= seconds:
                break
            for _ in prompts:
                submit()
        admitting = (len(generator.waiting) and generator.engine.cache.num_free) or \
            generator.prefilling
        decoding = sum(1 for live in generator.active.values() if live.next_token is not None)
        t0, native0 = time.perf_counter(), generator.engine.native_seconds
        events = generator.step()
        dt = time.perf_counter() - t0
        finished = sum(1 for e in events if e.finished_reason)
        stats["generated_tokens"] += len(events)
        if admitting:  # a step that prefills: count it as prefill (and time to first token)
            n_new = len(events) - decoding
            stats["prefill_s"] += dt
            stats["prefill_tokens"] += n_new * len(prompts[0])
            stats["ttft_s"] += [dt] * n_new
        elif decoding:
            stats["decode_step_s"].append(dt)
            stats["decode_s"] += dt
            stats["decode_native_s"] += generator.engine.native_seconds - native0
            stats["decode_tokens"] += decoding
        stats["iterations"] += finished
        if scenario == "async" and elapsed() < seconds:
            for _ in range(finished):
                submit()
        if bar is not None:
            bar.n = min(round(elapsed(), 1), seconds)
            bar.refresh()
    if bar is not None:
        bar.close()
    stats["seconds"] = elapsed()
    return stats


def _new_stats() -> dict[str, Any]:
    return dict(decode_step_s=[], decode_s=0.0, decode_native_s=0.0, decode_tokens=0,
                prefill_s=0.0, prefill_tokens=0, ttft_s=[], iterations=0, generated_tokens=0,
                seconds=0.0)


def _progress_bar(total: float, progress: bool | None) -> Any:
    if progress is False or (progress is None and not sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="s", desc="benchmarking", leave=False,
                bar_format="{desc} {bar} {n:.0f}/{total:.0f} s")


def _check_settings(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def compare_report(a: BenchmarkResult, b: BenchmarkResult) -> str:
    def ratio(x: float, y: float) -> str:
        return f"{x / y:.2f}x" if y else "n/a"

    lines = [
        f"{b.model} vs {a.model} (same process, same settings):",
        f"  decode throughput {b.throughput:.1f} vs {a.throughput:.1f} tok/s: "
        f"{ratio(b.throughput, a.throughput)}",
    ]
    rounds = [y / x for x, y in zip(a.round_throughputs, b.round_throughputs, strict=False)
              if x > 0]
    if len(rounds) > 1:
        lines.append(f"  decode ratio per round: median {np.median(rounds):.2f}x (min "
                     f"{min(rounds):.2f}x, max {max(rounds):.2f}x) over {len(rounds)} "
                     "interleaved rounds")
    return "\n".join(lines + [
        f"  prefill {b.prefill_tokens_per_s:.0f} vs {a.prefill_tokens_per_s:.0f} tok/s: "
        f"{ratio(b.prefill_tokens_per_s, a.prefill_tokens_per_s)}",
        f"  weights read per step {b.weight_bytes_per_step / 1e6:.1f} vs "
        f"{a.weight_bytes_per_step / 1e6:.1f} MB",
    ])
