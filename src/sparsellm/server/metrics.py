"""Prometheus text-format metrics, kept by hand (no client library needed)."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..generation.speculative import SpeculationStats

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _label(value: str) -> str:
    """A Prometheus label value (served ids are user strings: paths, `hf:org/name`)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    """Counters and a time-to-first-token histogram; safe to update from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: defaultdict[tuple[str, str, int], int] = defaultdict(int)
        self.errors: defaultdict[int, int] = defaultdict(int)
        self.tokens: defaultdict[str, int] = defaultdict(int)
        self.prompt_tokens: defaultdict[str, int] = defaultdict(int)
        self.disconnects = 0
        self.stream_errors = 0
        self.ttft_buckets: defaultdict[str, list[int]] = defaultdict(
            lambda: [0] * len(TTFT_BUCKETS))
        self.ttft_sum: defaultdict[str, float] = defaultdict(float)
        self.ttft_count: defaultdict[str, int] = defaultdict(int)

    def count_request(self, method: str, route: str, status: int) -> None:
        with self._lock:
            self.requests[(method, route, status)] += 1
            if status >= 400:
                self.errors[status] += 1

    def add_tokens(self, model: str, n: int) -> None:
        with self._lock:
            self.tokens[model] += n

    def add_prompt_tokens(self, model: str, n: int) -> None:
        with self._lock:
            self.prompt_tokens[model] += n

    def add_disconnect(self) -> None:
        with self._lock:
            self.disconnects += 1

    def add_stream_error(self) -> None:
        with self._lock:
            self.stream_errors += 1

    def observe_ttft(self, model: str, seconds: float) -> None:
        with self._lock:
            for i, bound in enumerate(TTFT_BUCKETS):
                if seconds <= bound:
                    self.ttft_buckets[model][i] += 1
            self.ttft_sum[model] += seconds
            self.ttft_count[model] += 1

    def render(self, gauges: Callable[[], dict[str, tuple[int, int]]] | None = None,
               speculation: Callable[[], dict[str, SpeculationStats]] | None = None) -> str:
        """Prometheus exposition text; `gauges()` -> {model: (active, waiting)};
        `speculation()` -> {model: its speculative decoding counts} for speculating models."""
        out: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")

        with self._lock:
            family("sparsellm_requests_total", "counter", "HTTP requests by route and status")
            for (method, route, status), n in sorted(self.requests.items()):
                out.append(f'sparsellm_requests_total{{method="{method}",route="{route}",'
                           f'status="{status}"}} {n}')
            family("sparsellm_errors_total", "counter",
                   "HTTP responses with status >= 400, and errors sent inside streams")
            for status, n in sorted(self.errors.items()):
                out.append(f'sparsellm_errors_total{{status="{status}"}} {n}')
            out.append(f'sparsellm_errors_total{{status="stream"}} {self.stream_errors}')
            family("sparsellm_client_disconnects_total", "counter",
                   "requests whose client went away before the end (generation cancelled)")
            out.append(f"sparsellm_client_disconnects_total {self.disconnects}")
            family("sparsellm_generated_tokens_total", "counter", "tokens generated")
            for model, n in sorted(self.tokens.items()):
                out.append(f'sparsellm_generated_tokens_total{{model="{_label(model)}"}} {n}')
            family("sparsellm_prompt_tokens_total", "counter", "prompt tokens processed")
            for model, n in sorted(self.prompt_tokens.items()):
                out.append(f'sparsellm_prompt_tokens_total{{model="{_label(model)}"}} {n}')
            family("sparsellm_time_to_first_token_seconds", "histogram",
                   "from submission to the first generated token")
            ttft = "sparsellm_time_to_first_token_seconds"
            for model in sorted(self.ttft_count):
                label = f'model="{_label(model)}"'
                for bound, n in zip(TTFT_BUCKETS, self.ttft_buckets[model], strict=True):
                    out.append(f'{ttft}_bucket{{{label},le="{bound}"}} {n}')
                out.append(f'{ttft}_bucket{{{label},le="+Inf"}} {self.ttft_count[model]}')
                out.append(f"{ttft}_sum{{{label}}} {self.ttft_sum[model]:.6f}")
                out.append(f"{ttft}_count{{{label}}} {self.ttft_count[model]}")
        if gauges is not None:
            counts = gauges()
            family("sparsellm_active_requests", "gauge", "sequences in engine batch slots")
            for model, (active, _) in sorted(counts.items()):
                out.append(f'sparsellm_active_requests{{model="{_label(model)}"}} {active}')
            family("sparsellm_queue_depth", "gauge", "requests waiting for a batch slot")
            for model, (_, waiting) in sorted(counts.items()):
                out.append(f'sparsellm_queue_depth{{model="{_label(model)}"}} {waiting}')
        if speculation is not None:
            _speculation_families(speculation(), family, out)
        return "\n".join(out) + "\n"


def _speculation_families(stats: dict[str, SpeculationStats],
                          family: Callable[[str, str, str], None], out: list[str]) -> None:
    """Counters of drafted and accepted tokens and of verifications (one per sequence that
    drafted in a step), and their ratios since the start (vLLM's spec_decode metrics)."""
    rows = [
        ("sparsellm_speculative_verifications_total", "counter",
         "speculative verifications (a sequence's drafted tokens checked in one model step)",
         lambda s: s.steps),
        ("sparsellm_speculative_draft_tokens_total", "counter", "tokens drafted",
         lambda s: s.proposed),
        ("sparsellm_speculative_accepted_tokens_total", "counter",
         "drafted tokens the model accepted", lambda s: s.accepted),
        ("sparsellm_speculative_acceptance_rate", "gauge",
         "accepted / drafted tokens since the start", lambda s: f"{s.acceptance_rate:.6f}"),
        ("sparsellm_speculative_tokens_per_verification", "gauge",
         "tokens emitted per verification (accepted + the model's own) since the start",
         lambda s: f"{s.tokens_per_step:.6f}"),
    ]
    for name, kind, help_text, value in rows:
        family(name, kind, help_text)
        for model, s in sorted(stats.items()):
            out.append(f'{name}{{model="{_label(model)}"}} {value(s)}')
