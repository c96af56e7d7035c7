"""Exact perplexity of a model over a list of texts, scored on the engine in batches.

Convention (the one transformers' `model(ids, labels=ids).loss` and llama.cpp's perplexity
follow, so numbers compare across tools):

* each text is tokenized with the model's tokenizer and its default special tokens (a BOS only
  if the tokenizer adds one; SmolLM2 adds none);
* every token after the first is scored given the tokens before it, so a sample of n tokens
  contributes n - 1 scored tokens; samples of 0 or 1 tokens contribute nothing;
* a sample longer than the window (`sequence_length` tokens) is scored with a strided window, as
  in Hugging Face's "perplexity of fixed-length models" guide: windows of `sequence_length` tokens
  advancing by `stride`, each token scored exactly once, in the window that ends closest after it
  (so it sees at least sequence_length - stride tokens of context, or all of them near the start);
  each window starts a fresh sequence at position 0;
* PPL = exp(total NLL / total scored tokens) over the whole dataset: token-weighted, not a mean
  of per-sample perplexities. Log-softmax is computed in float64.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..engine import Engine
from ..generation.sampling import log_softmax

LOGSOFTMAX_BLOCK = 128  # rows converted to float64 at a time (bounds the temporary memory)


@dataclass
class ScoreTotals:
    nll: float  # total negative log-likelihood, nats
    tokens: int  # tokens scored


@dataclass(frozen=True)
class Window:
    """Tokens [begin, end) of a sample fed as one sequence; targets [first_target, end) scored."""

    begin: int
    end: int
    first_target: int


def plan_windows(num_tokens: int, window: int, stride: int) -> list[Window]:
    """Windows covering targets 1..num_tokens-1 exactly once (see the module docstring)."""
    if window < 2:
        raise ValueError(f"the scoring window must be at least 2 tokens, got {window}")
    if not 1 <= stride < window:
        raise ValueError(
            f"stride must be in [1, sequence_length - 1] = [1, {window - 1}] so every token keeps "
            f"some context, got {stride}"
        )
    if num_tokens < 2:
        return []
    end = min(window, num_tokens)
    windows = [Window(0, end, 1)]
    while end < num_tokens:
        new_end = min(end + stride, num_tokens)
        windows.append(Window(max(0, new_end - window), new_end, end))
        end = new_end
    return windows


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits)[target] per row, computed in float64. logits: (n, vocab) -> (n,)."""
    out = np.empty(len(targets), dtype=np.float64)
    for start in range(0, len(targets), LOGSOFTMAX_BLOCK):
        logp = log_softmax(logits[start:start + LOGSOFTMAX_BLOCK])
        t = targets[start:start + LOGSOFTMAX_BLOCK]
        out[start:start + len(t)] = -logp[np.arange(len(t)), t]
    return out


@dataclass(eq=False)
class _Job:
    """One window being fed to the engine. Feed position j predicts targets[j] = ids[begin+j+1];
    the window's last token is only a target, so it is never fed."""

    feed: list[int]
    targets: np.ndarray  # (len(feed),) int64
    first_scored: int  # feed positions before this only build context
    fed: int = 0
    slot: int = -1

    @property
    def done(self) -> bool:
        return self.fed >= len(self.feed)


def score_token_ids(
    engine: Engine,
    samples: Sequence[Sequence[int]],
    window: int,
    stride: int,
    tokens_per_sequence_step: int | None = None,
    on_scored: Callable[[int], None] | None = None,
) -> ScoreTotals:
    """Total NLL and scored-token count of tokenized samples, running up to
    `engine.max_sequences` windows together in each `engine.step()` call.

    Each active window is extended by up to `tokens_per_sequence_step` tokens per step (default:
    the engine's prompt chunk). `on_scored(n)` is called after each step with the tokens scored.
    """
    if window > engine.sequence_length + 1:  # the window's last token is never fed
        raise ValueError(f"window {window} does not fit the engine's sequence_length "
                         f"{engine.sequence_length}")
    chunk = tokens_per_sequence_step or engine.prompt_chunk
    pending: deque[_Job] = deque()
    for ids in samples:
        ids_arr = np.asarray(ids, dtype=np.int64)
        for w in plan_windows(len(ids_arr), window, stride):
            pending.append(_Job(feed=ids_arr[w.begin:w.end - 1].tolist(),
                                targets=ids_arr[w.begin + 1:w.end],
                                first_scored=w.first_target - w.begin - 1))
    nll, count = 0.0, 0
    active: list[_Job] = []
    try:
        while pending or active:
            while pending and engine.cache.num_free:
                job = pending.popleft()
                job.slot = engine.add_sequence()
                active.append(job)
            seqs, chunks, rows, targets = [], [], [], []
            offset = 0
            for job in active:
                piece = job.feed[job.fed:job.fed + chunk]
                positions = np.arange(job.fed, job.fed + len(piece))
                scored = positions >= job.first_scored
                rows.append(offset + np.flatnonzero(scored))
                targets.append(job.targets[positions[scored]])
                seqs.append(job.slot)
                chunks.append(piece)
                offset += len(piece)
                job.fed += len(piece)
            row_idx, target_ids = np.concatenate(rows), np.concatenate(targets)
            logits = engine.step(seqs, chunks, row_idx)
            if len(row_idx):
                nll += float(token_nll(logits, target_ids).sum())
                count += len(row_idx)
                if on_scored:
                    on_scored(len(row_idx))
            for job in [j for j in active if j.done]:
                engine.release(job.slot)
                active.remove(job)
    finally:
        for job in active:
            engine.release(job.slot)
    return ScoreTotals(nll, count)


def perplexity_of(totals: ScoreTotals) -> float:
    if totals.tokens == 0:
        raise ValueError("no tokens to score: every sample has fewer than 2 tokens")
    return float(np.exp(totals.nll / totals.tokens))
