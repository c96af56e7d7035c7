"""lm-evaluation-harness on the native engine: an lm-eval model class and `evaluate_harness`.

    evaluate("./pruned50-int8", datasets=["hellaswag"], integration="lm-evaluation-harness")

Every request goes through the model's `TextGeneration` pipeline and its `BatchGenerator` (the
one generation core): a loglikelihood is a scoring-only request (one prefill of context +
continuation, the continuation's log-probabilities read from its logits), generate_until a greedy
or sampled generation with the task's stop strings. Conventions follow lm-eval's own `hf` backend
(tokenization with the tokenizer's default special tokens, the BOS or else EOS token as the
context of an empty one, left truncation to `max_length`), so scores compare with it.

lm-eval is an optional dependency (`pip install "sparsellm[lm-eval]"`); this module is imported
only when the integration is used.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    import lm_eval
    from lm_eval.api.model import TemplateLM
    from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as e:  # pragma: no cover -- depends on the environment
    raise ImportError("the lm-evaluation-harness integration needs lm-eval: "
                      'pip install "sparsellm[lm-eval]"') from e

from ..generation import GenerationRequest
from ..progress import progress_bar
from .result import HarnessResult

if TYPE_CHECKING:
    from ..models import Checkpoint
    from ..pipeline import TextGeneration
    from . import EvalSettings

log = logging.getLogger("sparsellm.evaluation")
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default for generate_until (its hf backend's too)
# generate_until settings that map onto GenerationConfig; others are ignored with a warning
_GEN_KWARGS = {"top_p": "top_p", "top_k": "top_k", "repetition_penalty": "repetition_penalty"}


class SparseLLM(TemplateLM):
    """An lm-eval model running on a `TextGeneration` pipeline.

    `max_length` (default: the pipeline's sequence_length) bounds context + continuation as in
    lm-eval's hf backend: scored inputs keep their last max_length + 1 tokens, generation
    contexts their last max_length - max_gen_toks.
    """

    def __init__(self, pipeline: TextGeneration, max_length: int | None = None,
                 max_gen_toks: int = DEFAULT_MAX_GEN_TOKS, progress: bool | None = None):
        super().__init__()
        self.pipeline = pipeline
        self.tokenizer = pipeline.tokenizer
        self.max_length = max_length or pipeline.sequence_length
        if self.max_length > pipeline.sequence_length:
            raise ValueError(f"max_length {self.max_length} is longer than the pipeline's "
                             f"sequence_length {pipeline.sequence_length}")
        self.max_gen_toks = max_gen_toks
        self.progress = progress

    # ---- tokens ---------------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        """The context of an empty context: BOS, else EOS (as lm-eval's hf backend)."""
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   **kwargs: Any) -> list[int]:
        """The tokenizer's default special tokens unless told, none when the string already
        starts with the BOS text."""
        if add_special_tokens is None:
            bos = self.tokenizer.bos_token_id
            add_special_tokens = bos is None or \
                not string.startswith(self.tokenizer.decode([bos]))
        return self.tokenizer.encode(string, add_special_tokens=add_special_tokens)

    def tok_decode(self, tokens: Sequence[int] | int, skip_special_tokens: bool = True) -> str:
        ids = [tokens] if isinstance(tokens, int) else list(tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    # ---- requests -------------------------------------------------------------------------------
    def _loglikelihood_tokens(self, requests: list[tuple[Any, list[int], list[int]]],
                              disable_tqdm: bool = False, **kwargs: Any
                              ) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probabilities, whether greedy decoding would have
        produced it) per (cache key, context ids, continuation ids)."""
        return self._score([(ctx, cont) for _, ctx, cont in requests], disable_tqdm)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False
                              ) -> list[float]:
        """Log-likelihood of whole texts, in disjoint windows of max_length tokens (each window
        after the first conditioned on one token of the previous, as lm-eval's hf backend)."""
        windows: list[tuple[int, tuple[list[int], list[int]]]] = []
        for i, (string,) in enumerate(r.args for r in requests):
            for pair in get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1):
                windows.append((i, make_disjoint_window(pair)))
        totals = [0.0] * len(requests)
        scores = self._score([w for _, w in windows], disable_tqdm)
        for (i, _), (logprob, _) in zip(windows, scores, strict=True):
            totals[i] += logprob
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Text generated from each context until a stop string, EOS or max_gen_toks."""
        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        batch = []
        for context, gen_kwargs in (r.args for r in requests):
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen_toks = kwargs.pop("max_gen_toks")
            if max_gen_toks >= self.max_length:
                raise ValueError(f"max_gen_toks {max_gen_toks} leaves no room for a context in "
                                 f"max_length {self.max_length}")
            ids = self.tok_encode(context)[-(self.max_length - max_gen_toks):]
            config = self.pipeline.config_for(
                max_generated_tokens=max_gen_toks, stop=until, **_sampling(kwargs))
            batch.append(GenerationRequest(ids, config))
        self._run(batch, "generating", disable_tqdm)
        outputs = [r.text for r in batch]
        for request, text in zip(requests, outputs, strict=True):
            self.cache_hook.add_partial("generate_until", request.args, text)
        return outputs

    # ---- on the generator -----------------------------------------------------------------------
    def _score(self, pairs: Sequence[tuple[list[int], list[int]]], disable_tqdm: bool
               ) -> list[tuple[float, bool]]:
        """One scoring-only request per (context, continuation): its last max_length + 1
        tokens, all but the last fed in one prefill."""
        config = self.pipeline.config_for(max_generated_tokens=1)  # nothing is generated
        batch = [GenerationRequest((ctx + cont)[-(self.max_length + 1):], config, logprobs=1,
                                   score_prompt=True, generate=False) for ctx, cont in pairs]
        self._run(batch, "scoring", disable_tqdm)
        out = []
        for r, (_, cont) in zip(batch, pairs, strict=True):
            scored = r.prompt_logprobs[len(r.prompt_logprobs) - len(cont):]
            greedy = all(next(iter(top)) == token
                         for token, (_, top) in zip(cont, scored, strict=True))
            out.append((sum(lp for lp, _ in scored), greedy))
        return out

    def _run(self, batch: list[GenerationRequest], what: str, disable_tqdm: bool) -> None:
        show = False if disable_tqdm else self.progress
        with progress_bar(len(batch), what, "request", show) as bar:
            for r in batch:
                r.on_event = lambda e: bar.update(1) if e.finished_reason else None
            self.pipeline.generator.run(batch)


def _sampling(kwargs: dict[str, Any]) -> dict[str, Any]:
    """GenerationConfig settings from lm-eval's normalized generation kwargs."""
    do_sample = kwargs.pop("do_sample", False)
    temperature = kwargs.pop("temperature", 0.0)
    out: dict[str, Any] = {"deterministic": not (do_sample and temperature > 0)}
    if not out["deterministic"]:
        out["sampling_temperature"] = float(temperature)
    for name, ours in _GEN_KWARGS.items():
        if name in kwargs:
            out[ours] = kwargs.pop(name)
    if kwargs:
        log.warning("generation settings not supported, ignored: %s", sorted(kwargs))
    return out


def task_names(tasks: str | Path | Sequence[str]) -> list[str]:
    """"a,b" or ["a", "b"] -> ["a", "b"]."""
    names = str(tasks).split(",") if isinstance(tasks, str | Path) else \
        [t for task in tasks for t in str(task).split(",")]
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise ValueError("no lm-eval tasks given: pass task names (e.g. hellaswag,arc_easy)")
    return names


def task_manager(tasks: Sequence[str],
                 include_path: str | Path | Sequence[str | Path] | None = None) -> TaskManager:
    """lm-eval's task index with the task YAML folders in `include_path` (local tasks need
    nothing from the network); an unknown task name is a ValueError."""
    paths = [include_path] if isinstance(include_path, str | Path) else include_path
    for path in paths or []:
        if not Path(path).exists():
            raise FileNotFoundError(f"include_path {path} does not exist")
    manager = TaskManager(include_path=[str(p) for p in paths] if paths else None)
    unknown = [t for t in tasks if not manager.match_tasks([t])]
    if unknown:
        raise ValueError(f"unknown lm-eval task(s) {unknown}; pass include_path for local task "
                         "YAML files (`lm_eval ls tasks` lists lm-eval's own)")
    return manager


def evaluate_harness(
    checkpoint: Checkpoint,
    tasks: Sequence[str],
    settings: EvalSettings,
    manager: TaskManager,
    *,
    num_fewshot: int | None = None,
    max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
) -> HarnessResult:
    """lm-eval's `simple_evaluate` of `tasks` (found by `manager`) on the native engine,
    `settings.limit` documents per task."""
    from ..pipeline import TextGeneration

    start = time.perf_counter()
    pipeline = TextGeneration(checkpoint, settings=settings.engine)
    model = SparseLLM(pipeline, max_gen_toks=max_gen_toks, progress=settings.progress)
    out = lm_eval.simple_evaluate(model=model, tasks=list(tasks), num_fewshot=num_fewshot,
                                  limit=settings.limit, task_manager=manager, log_samples=False)
    results = {task: {k: _plain(v) for k, v in metrics.items() if k not in ("alias", "name")}
               for task, metrics in out["results"].items()}
    samples = sum(int(n.get("effective", 0)) for n in out.get("n-samples", {}).values())
    return HarnessResult(
        **settings.result_header(checkpoint, samples, start),
        tasks=list(tasks), results=results, num_fewshot=num_fewshot,
        lm_eval_version=lm_eval.__version__,
    )


def _plain(value: Any) -> Any:
    """NumPy scalars as Python numbers (JSON output)."""
    return value.item() if hasattr(value, "item") else value
