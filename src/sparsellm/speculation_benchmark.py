"""Speculative decoding over a prompt set: for each drafting method, its speedup over plain greedy
decode of the same model on every prompt (median, worst, best; per kind of prompt), its
acceptance rate and tokens per verification step, and whether every output equals plain decode's.

    sparsellm benchmark smollm2-135m-instruct --speculation      # the shipped prompt set
    sparsellm benchmark MODEL --prompts my_prompts.jsonl --draft-model auto --draft-model ./draft

A prompt file is JSON lines, each a string or an object with "prompt" (tokenized as is) or
"messages" (a chat, through the model's chat template), and optionally "name" and "kind"; or
plain text, one prompt per line. The shipped set (`DEFAULT_PROMPTS`) has four prompts each of
code, prose, chat and copy-heavy requests (edit or summarise a given text or code, where the
output copies the input).

The methods are plain decoding, prompt lookup, and for each draft model (default: "auto", the
model drafting for itself) the draft alone and prompt lookup falling back to it. All share one
main engine and run one prompt at a time (the latency case), greedy, `generated_tokens` tokens
each (EOS does not stop them, so every method generates the same count). Rounds rotate the order
of the methods per prompt; a (prompt, method) time is the median of its rounds.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .engine import EngineSettings
from .engine.settings import SELF_DRAFT, SELF_DRAFT_WEIGHTS
from .generation import GenerationConfig, GenerationRequest, build_stack
from .generation.speculative import SpeculationStats
from .models import load_checkpoint
from .progress import progress_bar

DEFAULT_PROMPTS = Path(__file__).parent / "data" / "speculation_prompts.jsonl"
PLAIN, LOOKUP = "plain", "prompt-lookup"


@dataclass
class Prompt:
    name: str
    kind: str
    text: str | None = None  # tokenized as is
    messages: list[dict[str, Any]] | None = None  # or a chat, through the chat template


def read_prompts(path: str | Path) -> list[Prompt]:
    """The prompts of a JSON-lines file (a string or {"prompt" | "messages", "name", "kind"}
    per line) or of a text file (one prompt per line); blank lines are skipped."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {str(path)!r} does not exist")
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        name = f"{path.name}:{number}"
        if path.suffix not in (".jsonl", ".json"):
            prompts.append(Prompt(name, "text", text=line))
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name}: not JSON ({e.msg})") from None
        if isinstance(row, str):
            row = {"prompt": row}
        if not isinstance(row, dict) or ("prompt" in row) == ("messages" in row) or \
                not isinstance(row.get("prompt", ""), str) or \
                not isinstance(row.get("messages", []), list):
            raise ValueError(f'{name}: expected a string, {{"prompt": "..."}} or '
                             '{"messages": [...]} (one of the two)')
        prompts.append(Prompt(str(row.get("name", name)), str(row.get("kind", "text")),
                              row.get("prompt"), row.get("messages")))
    if not prompts:
        raise ValueError(f"prompt file {str(path)!r} has no prompts")
    return prompts


@dataclass
class MethodResult:
    method: str
    seconds: list[float]  # per prompt, the median of its rounds
    identical: list[bool]  # per prompt: every round's output equals plain decode's
    stats: SpeculationStats = field(default_factory=SpeculationStats)


@dataclass
class SpeculationBenchmark:
    model: str
    weights: str
    num_cores: int
    generated_tokens: int
    num_speculative_tokens: int
    adaptive: bool
    rounds: int
    prompts: list[Prompt]
    methods: list[MethodResult]

    def method(self, name: str) -> MethodResult:
        return next(m for m in self.methods if m.method == name)

    def speedups(self, name: str, kind: str | None = None) -> list[float]:
        """Per prompt (of `kind`, if given): plain decode's time / the method's."""
        plain, m = self.method(PLAIN), self.method(name)
        return [p / s for p, s, prompt in zip(plain.seconds, m.seconds, self.prompts, strict=True)
                if kind is None or prompt.kind == kind]

    @property
    def kinds(self) -> list[str]:
        return list(dict.fromkeys(p.kind for p in self.prompts))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for m in out["methods"]:
            s = self.speedups(m["method"])
            stats = self.method(m["method"]).stats
            m.update(speedup_median=statistics.median(s), speedup_min=min(s),
                     speedup_max=max(s), acceptance_rate=stats.acceptance_rate,
                     tokens_per_step=stats.tokens_per_step, speedups=s)
        return out

    def report(self) -> str:
        kinds = self.kinds
        width = max(len(m.method) for m in self.methods) + 2
        head = (f"{'method':<{width}}{'median':>8}{'worst':>8}{'best':>8}{'accept':>8}"
                f"{'tok/step':>10}{'same':>8}" + "".join(f"{k:>8}" for k in kinds))
        lines = [
            f"speculative decoding of {self.model} ({self.weights}), {len(self.prompts)} prompts "
            f"x {self.generated_tokens} greedy tokens, {self.num_cores} threads, "
            f"{'adaptive ' if self.adaptive else ''}up to {self.num_speculative_tokens} drafted "
            f"tokens per step, {self.rounds} round{'s' * (self.rounds > 1)}",
            "speedup over plain decode per prompt (median, worst, best; median per kind of "
            "prompt); same: outputs equal to plain decode's",
            head,
        ]
        for m in self.methods:
            s = self.speedups(m.method)
            speculative = m.method != PLAIN
            accept = f"{m.stats.acceptance_rate:.0%}" if speculative and m.stats.proposed else "-"
            per_step = f"{m.stats.tokens_per_step:.2f}" if speculative and m.stats.steps else "-"
            lines.append(
                f"{m.method:<{width}}{statistics.median(s):>7.2f}x{min(s):>7.2f}x{max(s):>7.2f}x"
                f"{accept:>8}{per_step:>10}{f'{sum(m.identical)}/{len(m.identical)}':>8}"
                + "".join(f"{statistics.median(self.speedups(m.method, k)):>7.2f}x"
                          for k in kinds))
        plain = self.method(PLAIN)
        rate = self.generated_tokens / statistics.median(plain.seconds)
        lines.append(f"plain decode: {rate:.1f} tokens/s per prompt (median, prefill included)")
        return "\n".join(lines)


def benchmark_speculation(
    model: str | Path,
    prompts: str | Path | Sequence[Prompt] = DEFAULT_PROMPTS,
    draft_models: Sequence[str | Path] = (SELF_DRAFT,),
    prompt_lookup: bool = True,
    generated_tokens: int = 128,
    rounds: int = 1,
    progress: bool | None = None,
    adaptive: bool | None = None,
    settings: EngineSettings | None = None,
    **engine_settings: Any,
) -> SpeculationBenchmark:
    """Plain greedy decode and every speculative method on every prompt (module docstring).
    `draft_models`: paths, registry names or "auto" (the model in `draft_weights`, default
    SELF_DRAFT_WEIGHTS); `prompt_lookup` adds prompt lookup alone and in front of each draft.
    The model runs as `settings` with `engine_settings` applied (any `EngineSettings` field:
    weights, num_cores, kv_cache_dtype, draft_weights for every draft, num_speculative_tokens,
    adaptive_speculation (or `adaptive`), ...; one sequence at a time)."""
    if generated_tokens < 1 or rounds < 1:
        raise ValueError(f"generated_tokens and rounds must be >= 1, got {generated_tokens} "
                         f"and {rounds}")
    settings = (settings or EngineSettings()).replace(
        model_path=model, batch_size=1, adaptive_speculation=adaptive, **engine_settings)
    if not isinstance(prompts, Sequence) or isinstance(prompts, str):
        prompts = read_prompts(prompts)
    checkpoint = load_checkpoint(model)
    tokenizer = checkpoint.tokenizer
    ids = [tokenizer.encode(p.text) if p.messages is None else
           tokenizer.apply_chat_template(p.messages, add_generation_prompt=True)
           for p in prompts]
    # Every method on one main engine: each stack after the first reuses it (and a draft's
    # engine serves that draft alone and behind lookup).
    plain = replace(settings, sequence_length=max(len(i) for i in ids) + generated_tokens + 1,
                    draft_model_path=None, prompt_lookup=False)
    first = build_stack(plain, checkpoint)
    engine = first.engine
    generators = {PLAIN: first.generator}
    if prompt_lookup:
        generators[LOOKUP] = build_stack(replace(plain, prompt_lookup=True),
                                         engine=engine).generator
    draft_weights = settings.draft_weights
    for d in draft_models:
        drafted = build_stack(plain.replace(draft_model_path=d), engine=engine)
        name = f"self ({draft_weights or SELF_DRAFT_WEIGHTS})" if str(d) == SELF_DRAFT else \
            f"draft {d}" + (f" ({draft_weights})" if draft_weights else "")
        generators[name] = drafted.generator
        if prompt_lookup:
            generators[f"{LOOKUP}+{name}"] = build_stack(
                replace(plain, prompt_lookup=True), engine=engine,
                draft_engine=drafted.draft_engine).generator

    config = GenerationConfig(max_generated_tokens=generated_tokens, force_max_tokens=True)
    warmup = GenerationConfig(max_generated_tokens=8, force_max_tokens=True)
    for generator in generators.values():
        generator.run([GenerationRequest(ids[0], warmup)])
        generator.speculation = SpeculationStats()
    names = list(generators)
    times: dict[str, list[list[float]]] = {n: [[] for _ in ids] for n in names}
    outputs: dict[str, list[list[list[int]]]] = {n: [[] for _ in ids] for n in names}
    with progress_bar(rounds * len(ids) * len(names), "benchmarking", "run",
                      enabled=progress) as bar:
        for r in range(rounds):
            for i, prompt_ids in enumerate(ids):
                shift = (r + i) % len(names)
                for name in names[shift:] + names[:shift]:
                    started = time.perf_counter()
                    done = generators[name].run([GenerationRequest(prompt_ids, config)])[0]
                    times[name][i].append(time.perf_counter() - started)
                    outputs[name][i].append(done.output_ids)
                    bar.update()
    plain_outputs = [runs[0] for runs in outputs[PLAIN]]
    return SpeculationBenchmark(
        model=str(model), weights=settings.weights or engine.weights_description,
        num_cores=engine.num_threads, generated_tokens=generated_tokens, rounds=rounds,
        prompts=list(prompts), num_speculative_tokens=settings.num_speculative_tokens,
        adaptive=settings.adaptive_speculation,
        methods=[MethodResult(name, [statistics.median(t) for t in times[name]],
                              [all(o == p for o in runs)
                               for runs, p in zip(outputs[name], plain_outputs, strict=True)],
                              generators[name].speculation)
                 for name in names],
    )
