"""Logits processors and samplers as small composable functions (after mlx-lm's make_sampler).

`make_distribution(config)` turns a row of logits into the probabilities a token is drawn from,
with temperature, top-k, top-p and repetition penalty applied; speculative sampling uses the same
function for the draft and the main model so both see the same filtering.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .config import GenerationConfig

LogitsProcessor = Callable[[np.ndarray, Sequence[int]], np.ndarray]
_HUGE = 1e300


def repetition_penalty(penalty: float) -> LogitsProcessor:
    """CTRL-style: divide positive logits of already-seen tokens by `penalty`, multiply negative."""

    def apply(logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        if not len(history):
            return logits
        ids = np.unique(np.asarray(history))
        seen = logits[ids].astype(np.float64)
        logits = logits.astype(np.float64)
        with np.errstate(over="ignore", divide="ignore"):
            penalized = np.where(seen > 0, seen / penalty, seen * penalty)
        logits[ids] = np.clip(penalized, -_HUGE, _HUGE)  # extreme penalties stay finite
        return logits

    return apply


def temperature(t: float) -> LogitsProcessor:
    # Shift before scaling: a tiny t then sends the best logit to 0 and the rest towards -inf
    # instead of overflowing to +inf (same distribution, no NaN).
    def apply(logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        x = np.asarray(logits, dtype=np.float64)
        with np.errstate(over="ignore"):
            return (x - x.max()) / t

    return apply


def top_k(k: int) -> LogitsProcessor:
    def apply(logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        if k >= logits.shape[-1]:
            return logits
        kth = np.partition(logits, -k)[-k]
        return np.where(logits < kth, -np.inf, logits)

    return apply


def top_p(p: float) -> LogitsProcessor:
    """Keep the smallest set of most likely tokens whose probability reaches p."""

    def apply(logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        order = np.argsort(-logits, kind="stable")
        probs = softmax(logits[order])
        keep = np.cumsum(probs) - probs < p  # a token stays if the mass before it is < p
        out = np.full_like(logits, -np.inf)
        out[order[keep]] = logits[order[keep]]
        return out

    return apply


def make_logits_processors(config: GenerationConfig) -> list[LogitsProcessor]:
    procs: list[LogitsProcessor] = []
    if config.repetition_penalty != 1.0:
        procs.append(repetition_penalty(config.repetition_penalty))
    if config.deterministic:
        return procs
    procs.append(temperature(config.sampling_temperature))
    if config.top_k:
        procs.append(top_k(config.top_k))
    if config.top_p < 1.0:
        procs.append(top_p(config.top_p))
    return procs


def log_softmax(x: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, in float64."""
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float64; in a row with +inf logits (an extreme repetition
    penalty) those share all the mass, and the other rows are untouched."""
    x = np.asarray(x, dtype=np.float64)
    top = np.isposinf(x)
    rows = top.any(axis=-1, keepdims=True)
    if rows.any():
        x = np.where(rows, np.where(top, 0.0, -np.inf), x)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def make_distribution(
    config: GenerationConfig,
) -> Callable[[np.ndarray, Sequence[int]], np.ndarray]:
    """logits (vocab,), history -> probabilities (vocab,) in float64 (one-hot when greedy)."""
    procs = make_logits_processors(config)

    def distribution(logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        for proc in procs:
            logits = proc(logits, history)
        if config.deterministic:
            probs = np.zeros(logits.shape[-1])
            probs[int(np.argmax(logits))] = 1.0
            return probs
        return softmax(logits)

    return distribution


class Sampler:
    """Picks the next token of one sequence; owns that sequence's random generator."""

    def __init__(self, config: GenerationConfig):
        self.config = config
        self.procs = make_logits_processors(config)
        self.distribution = make_distribution(config)
        self.rng = np.random.default_rng(config.seed)

    def __call__(self, logits: np.ndarray, history: Sequence[int]) -> int:
        if self.config.deterministic:
            for proc in self.procs:
                logits = proc(logits, history)
            return int(logits.argmax())
        return self.draw(self.distribution(logits, history))

    def draw(self, probs: np.ndarray) -> int:
        return draw(probs, self.rng)


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """A token from `probs`; a one-hot distribution (greedy) needs no randomness."""
    if probs.max() == 1.0:
        return int(np.argmax(probs))
    return int(rng.choice(probs.shape[-1], p=probs / probs.sum()))
