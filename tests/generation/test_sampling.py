"""Logits processors and the sampler vs direct NumPy and transformers' own processors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from sparsellm.generation import GenerationConfig, Sampler, make_distribution
from sparsellm.generation.sampling import (
    draw,
    log_softmax,
    make_logits_processors,
    repetition_penalty,
    softmax,
    temperature,
    top_k,
    top_p,
)

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


# ---- edges a wrong branch would get silently wrong (found by mutation testing) ------------------
def test_top_k_of_the_whole_vocabulary_is_the_logits_themselves(logits):
    assert top_k(V)(logits, []) is logits and top_k(V + 1)(logits, []) is logits


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("k", [2, 3, 7, 20])
def test_top_k_keeps_exactly_the_k_largest_of_a_real_vocabulary(seed, k):
    """A vocabulary-sized row: np.partition leaves small arrays sorted, hiding a wrong index."""
    x = np.random.default_rng(seed).standard_normal(4096)
    out = top_k(k)(x, [])
    np.testing.assert_array_equal(np.flatnonzero(np.isfinite(out)), np.sort(np.argsort(-x)[:k]))


def test_top_p_breaks_ties_by_token_id():
    """Equal logits at the cut: the lower token ids stay (a stable sort), whatever the order
    NumPy's default (unstable) sort would give."""
    x = np.repeat([2.0, 1.0, 0.0], [10, 30, 10])[np.random.default_rng(0).permutation(V)]
    probs = softmax(x)
    high = probs[x == 2.0].sum()
    p = high + 5.5 * probs[x == 1.0][0]  # the cut falls after the 6th token of the middle level
    kept = np.flatnonzero(np.isfinite(top_p(p)(x, [])))
    np.testing.assert_array_equal(kept, np.sort(np.concatenate(
        [np.flatnonzero(x == 2.0), np.flatnonzero(x == 1.0)[:6]])))


def test_top_p_stops_when_the_mass_reaches_p_exactly():
    x = np.array([1.0, 1.0, -np.inf])  # probabilities 0.5, 0.5, 0: the first token reaches 0.5
    assert np.isfinite(top_p(0.5)(x, [])).tolist() == [True, False, False]
    assert np.isfinite(top_p(0.51)(x, [])).tolist() == [True, True, False]


def test_processors_are_made_only_for_settings_that_are_on():
    def count(**kw):
        return len(make_logits_processors(GenerationConfig(**kw)))

    assert count() == 0  # greedy, no penalty
    assert count(repetition_penalty=2.0) == 1
    assert count(deterministic=False) == 1  # temperature only: top_p=1.0 and top_k=0 are off
    assert count(deterministic=False, top_k=3, top_p=0.9, repetition_penalty=1.1) == 4


def test_penalty_of_two_applies_through_the_distribution(logits):
    best = int(np.argmax(logits))
    assert make_distribution(GenerationConfig(repetition_penalty=2.0))(
        logits, [best]).argmax() == int(np.argmax(repetition_penalty(2.0)(logits, [best])))
    second = int(np.argsort(-logits)[1])
    assert logits[best] / 2 < logits[second]  # so the penalty changes the greedy token
    assert make_distribution(GenerationConfig(repetition_penalty=2.0))(logits, [best])[best] == 0


def test_sampler_applies_the_penalty_to_the_history(logits):
    best = int(np.argmax(logits))
    cfg = GenerationConfig(deterministic=False, top_k=1, repetition_penalty=100.0, seed=0)
    assert Sampler(cfg)(logits, []) == best
    assert Sampler(cfg)(logits, [best]) == int(np.argsort(-logits)[1])


def test_extreme_settings_are_exact_and_silent(logits):
    """No floating-point warning and the right distribution where a naive formula overflows."""
    best = int(np.argmax(logits))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # tiny temperature: one-hot on the best token (not a tie of overflowed logits)
        probs = make_distribution(GenerationConfig(deterministic=False,
                                                   sampling_temperature=5e-324))(logits, [])
        np.testing.assert_array_equal(probs, np.eye(V)[best])
        # a penalty that overflows a positive logit: it wins alone (clipped, finite)
        pos = int(np.flatnonzero(logits > 0)[0])
        out = repetition_penalty(1e-320)(logits, [pos])
        assert out[pos] == 1e300 and np.isfinite(out).all()
        probs = make_distribution(GenerationConfig(deterministic=False,
                                                   repetition_penalty=1e-320))(logits, [pos])
        np.testing.assert_array_equal(probs, np.eye(V)[pos])
        # every token seen and negative, enormous penalty: still a (uniform) distribution
        neg = -np.abs(logits) - 1
        out = repetition_penalty(1e300)(neg, list(range(V)))
        assert (out == -1e300).all()
        probs = make_distribution(GenerationConfig(deterministic=False,
                                                   repetition_penalty=1e300))(neg, range(V))
        np.testing.assert_allclose(probs, np.full(V, 1 / V))


def test_softmax_rows_large_logits_and_infinities():
    x = np.array([[1000.0, 999.0, -np.inf], [0.0, np.log(3.0), 5.0]])
    want = np.exp(x - x.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(softmax(x), want, rtol=1e-12)  # over the last axis, each row
    np.testing.assert_allclose(softmax(x[1]), want[1], rtol=1e-12)
    # +inf logits (an extreme penalty) share all the mass
    np.testing.assert_array_equal(softmax(np.array([1.0, np.inf, 2.0, np.inf])),
                                  [0, 0.5, 0, 0.5])


def test_softmax_an_infinite_logit_changes_only_its_own_row():
    x = np.array([[1.0, np.inf, 2.0], [0.0, np.log(3.0), -np.inf], [2.0, 2.0, 2.0]])
    got = softmax(x)
    np.testing.assert_array_equal(got[0], [0.0, 1.0, 0.0])
    np.testing.assert_allclose(got[1], [0.25, 0.75, 0.0], rtol=1e-12)
    np.testing.assert_allclose(got[2], [1 / 3] * 3, rtol=1e-12)
    np.testing.assert_allclose(got[1:], softmax(x[1:]), rtol=0)  # as without the +inf row


def test_log_softmax_matches_scipy_on_rows():
    x = np.random.default_rng(1).standard_normal((3, V)) * 30
    x[1, 4] = 1e4  # large logits must not overflow
    want = x - logsumexp(x, axis=-1, keepdims=True)
    got = log_softmax(x.astype(np.float32))
    assert got.dtype == np.float64 and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(log_softmax(x[2]), want[2], rtol=1e-12, atol=1e-12)


def test_draw_one_hot_uses_no_randomness_and_normalizes_the_rest():
    rng, fresh = np.random.default_rng(5), np.random.default_rng(5)
    assert draw(np.eye(V)[17], rng) == 17
    assert rng.random() == fresh.random()  # the generator did not move
    # unnormalized weights (a speculative residual) are normalized before drawing
    assert draw(np.array([0.0, 3.0, 0.0]), rng) == 1
    got = [draw(np.array([2.0, 6.0]), rng) for _ in range(2000)]
    assert abs(np.mean(got) - 0.75) < 0.04
