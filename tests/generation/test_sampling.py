"""Logits processors and the sampler vs direct NumPy and transformers' own processors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from sparsellm.generation import GenerationConfig, Sampler, make_distribution
from sparsellm.generation.sampling import repetition_penalty, softmax, temperature, top_k, top_p

V = 50


@pytest.fixture
def logits():
    return np.random.default_rng(0).standard_normal(V).astype(np.float32) * 3


def _hf(proc, logits, history=(0,)):
    out = proc(torch.tensor([list(history)]), torch.from_numpy(logits.copy())[None])
    return out[0].numpy()


@pytest.mark.parametrize("k", [1, 5, 49, 50, 100])
def test_top_k(logits, k):
    out = top_k(k)(logits, [])
    kept = np.isfinite(out)
    assert kept.sum() == min(k, V)
    np.testing.assert_array_equal(np.sort(np.argsort(-logits)[:k]), np.flatnonzero(kept))
    np.testing.assert_array_equal(out[kept], logits[kept])
    np.testing.assert_array_equal(out, _hf(TopKLogitsWarper(k), logits))


@pytest.mark.parametrize("p", [0.05, 0.3, 0.9, 0.999])
def test_top_p(logits, p):
    out = top_p(p)(logits, [])
    # direct: the smallest prefix of tokens sorted by probability whose mass reaches p
    order = np.argsort(-logits)
    probs = softmax(logits)[order]
    n = int(np.searchsorted(np.cumsum(probs), p) + 1)
    np.testing.assert_array_equal(np.flatnonzero(np.isfinite(out)), np.sort(order[:n]))
    np.testing.assert_array_equal(np.isfinite(out), np.isfinite(_hf(TopPLogitsWarper(p), logits)))


@pytest.mark.parametrize("penalty", [0.7, 1.3, 2.0])
def test_repetition_penalty(logits, penalty):
    history = [3, 7, 7, 12, 40]
    out = repetition_penalty(penalty)(logits, history)
    expected = logits.copy()
    for i in set(history):
        expected[i] = logits[i] / penalty if logits[i] > 0 else logits[i] * penalty
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    np.testing.assert_allclose(out, _hf(RepetitionPenaltyLogitsProcessor(penalty), logits,
                                        history), rtol=1e-6)
    assert repetition_penalty(penalty)(logits, []) is logits


def test_temperature(logits):
    # Our processor also shifts the logits (no overflow for tiny t): compare distributions.
    np.testing.assert_allclose(softmax(temperature(0.5)(logits, [])),
                               softmax(_hf(TemperatureLogitsWarper(0.5), logits)), rtol=1e-6)


def test_extreme_temperature_and_penalty_give_valid_distributions(logits):
    for cfg in [dict(sampling_temperature=5e-324), dict(repetition_penalty=1e-300),
                dict(repetition_penalty=1e300, sampling_temperature=1e-300, top_p=0.5)]:
        probs = make_distribution(GenerationConfig(deterministic=False, **cfg))(logits, [1, 2, 3])
        assert np.isfinite(probs).all() and np.isclose(probs.sum(), 1.0)


def test_distribution_composes_penalty_temperature_top_k_top_p(logits):
    cfg = GenerationConfig(deterministic=False, sampling_temperature=0.7, top_k=10, top_p=0.8,
                           repetition_penalty=1.5)
    history = [int(np.argmax(logits)), 4]
    x = logits.astype(np.float64)  # the processors work in float64
    for i in set(history):
        x[i] = x[i] / 1.5 if x[i] > 0 else x[i] * 1.5
    x = x / 0.7
    x[x < np.sort(x)[-10]] = -np.inf
    order = np.argsort(-x)
    p = softmax(x)[order]
    drop = order[np.cumsum(p) - p >= 0.8]
    x[drop] = -np.inf
    expected = softmax(x)
    np.testing.assert_allclose(make_distribution(cfg)(logits, history), expected, atol=1e-12)


def test_greedy_distribution_is_one_hot_after_penalty(logits):
    best = int(np.argmax(logits))
    cfg = GenerationConfig(repetition_penalty=100.0)
    probs = make_distribution(cfg)(logits, [best])
    assert probs.sum() == 1 and probs.argmax() != best
    assert Sampler(cfg)(logits, [best]) == probs.argmax()
    assert Sampler(GenerationConfig())(logits, [best]) == best


def test_seeded_sampling_is_reproducible_and_follows_the_distribution(logits):
    cfg = GenerationConfig(deterministic=False, sampling_temperature=1.0, top_k=5, seed=123)
    draws = [Sampler(cfg)(logits, []) for _ in range(3)]
    assert len(set(draws)) == 1  # same seed, same first draw
    a, b = Sampler(cfg), Sampler(cfg)
    seq_a = [a(logits, []) for _ in range(200)]
    assert seq_a == [b(logits, []) for _ in range(200)]
    other = Sampler(GenerationConfig.from_kwargs(cfg, seed=124))
    assert seq_a != [other(logits, []) for _ in range(200)]
    # empirical frequencies over 4000 draws follow the top-5 softmax (and never leave the top 5)
    big = [a(logits, []) for _ in range(4000)]
    counts = np.bincount(big, minlength=V) / len(big)
    expected = make_distribution(cfg)(logits, [])
    assert set(np.flatnonzero(counts)) <= set(np.argsort(-logits)[:5])
    np.testing.assert_allclose(counts, expected, atol=0.03)
