"""Prompt-lookup drafting (drafters.py `PromptLookup`): the n-gram matcher, greedy output identical
to plain decoding, sampling distribution exact, and the Pipeline / CLI options."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from sparsellm import Pipeline
from sparsellm.engine import Engine
from sparsellm.generation import BatchGenerator, GenerationConfig, GenerationRequest
from sparsellm.generation.drafters import (
    DraftModel,
    DraftRequest,
    PromptLookup,
    lookup_continuation,
)
from sparsellm.generation.sampling import Sampler, make_distribution
from sparsellm.generation.speculative import Speculator
from sparsellm.models import load_checkpoint

PROMPTS = ["def fibonacci(n):", "Hello world", "0123456789", "The quick brown fox",
           "x = [1, 2, 3]", "for i in range(10):"]


def test_lookup_proposes_what_followed_the_most_recent_match():
    # copy-heavy: the last 2 tokens (7, 8) occurred twice; the later occurrence wins
    seq = [5, 7, 8, 1, 2, 3, 9, 7, 8, 4, 6, 0, 7, 8]
    assert lookup_continuation(seq, 3, max_ngram=2) == [4, 6, 0]
    # k limits the proposal; a continuation that runs into the end stops... or repeats (below)
    assert lookup_continuation(seq, 1, max_ngram=2) == [4]
    # the longest n-gram wins over a more recent shorter one: (1, 2, 3) occurs once, early
    seq = [1, 2, 3, 4, 5, 3, 6, 1, 2, 3]
    assert lookup_continuation(seq, 2, max_ngram=3) == [4, 5]
    assert lookup_continuation(seq, 2, max_ngram=1) == [6, 1]  # unigram 3: its latest, at 5


def test_lookup_without_a_match_proposes_nothing():
    assert lookup_continuation([1, 2, 3, 4], 3) == []  # 4 never occurred before
    assert lookup_continuation([1, 2, 3, 1], 3, min_ngram=2) == []  # (3, 1) is new
    assert lookup_continuation([7], 3) == [] and lookup_continuation([], 3) == []
    assert lookup_continuation([1, 2, 1], 0) == []
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookup(10, max_ngram=1, min_ngram=2)


def test_lookup_overlapping_match_repeats_the_pattern():
    # the match of (1, 2, 1) at 0 overlaps the last 3 tokens: the continuation runs on into
    # the proposed tokens, i.e. the period (1, 2) repeats
    assert lookup_continuation([1, 2, 1, 2, 1], 5) == [2, 1, 2, 1, 2]
    assert lookup_continuation([4, 4], 3) == [4, 4, 4]
    assert lookup_continuation([9, 3, 3, 3], 4, max_ngram=2) == [3, 3, 3, 3]


def test_prompt_lookup_drafter_one_hot_and_fallback():
    config = GenerationConfig()
    lookup = PromptLookup(10, max_ngram=2)
    reqs = [DraftRequest("a", 8, 3, Sampler(config), [5, 7, 8, 1, 2, 7, 8]),
            DraftRequest("b", 4, 3, Sampler(config), [1, 2, 3, 4])]
    for key, r in zip("ab", reqs, strict=True):
        lookup.start(key, r.history)
    found, missing = lookup.propose(reqs)
    assert found.tokens == [1, 2, 7] and missing.tokens == [] and missing.q == []
    np.testing.assert_array_equal(np.asarray(found.q), np.eye(10)[[1, 2, 7]])


@pytest.fixture(scope="module")
def main(tiny_model_dir):
    return load_checkpoint(tiny_model_dir("llama"))


def _run(checkpoint, prompts, config, k=4, lookup=True, draft=None, adaptive=False,
         cost_ratio=None):
    engine = Engine(checkpoint, sequence_length=256, max_sequences=4)
    drafter = DraftModel(Engine(draft, sequence_length=256, max_sequences=4), engine,
                         checkpoint.tokenizer) if draft is not None else None
    if lookup:
        drafter = PromptLookup(engine.vocab_size, fallback=drafter)
    speculator = Speculator(drafter, k, adaptive, cost_ratio) if drafter else None
    gen = BatchGenerator(engine, checkpoint.tokenizer, checkpoint.eos_token_ids,
                         speculator=speculator)
    reqs = gen.run([GenerationRequest(checkpoint.tokenizer.encode(p), config) for p in prompts])
    return reqs, gen.speculation


@pytest.mark.parametrize("k", [1, 4])
def test_prompt_lookup_greedy_equals_plain(main, k):
    config = GenerationConfig(max_generated_tokens=64, force_max_tokens=True)
    plain, _ = _run(main, PROMPTS, config, lookup=False)
    spec, st = _run(main, PROMPTS, config, k=k)
    assert [r.output_ids for r in spec] == [r.output_ids for r in plain]
    assert [r.text for r in spec] == [r.text for r in plain]
    assert 0 < st.accepted < st.proposed  # lookup ran, and was both right and wrong
    # adaptive k, and lookup first with a draft model where lookup finds nothing: same output
    both, st_both = _run(main, PROMPTS, config, k=k, draft=main, adaptive=True, cost_ratio=0.2)
    assert [r.output_ids for r in both] == [r.output_ids for r in plain]
    assert st_both.proposed > st.proposed  # the draft model filled in for missed lookups


@pytest.mark.parametrize("text", ["the cat sat on the mat. " * 6, "ab " * 30])
def test_prompt_lookup_accepts_on_a_repeating_prompt(main, text):
    """A prompt that repeats itself: the drafts lookup copies from it are accepted sometimes
    (the tiny random model follows a pattern only in part), the output stays plain greedy's."""
    prompt = main.tokenizer.encode(text)
    config = GenerationConfig(max_generated_tokens=40, force_max_tokens=True)
    engine = Engine(main, sequence_length=256)
    plain = BatchGenerator(engine, main.tokenizer, []).run([GenerationRequest(prompt, config)])
    spec = BatchGenerator(engine, main.tokenizer, [], speculator=Speculator(
        PromptLookup(engine.vocab_size), 4, adaptive=False))
    out = spec.run([GenerationRequest(prompt, config)])
    assert out[0].output_ids == plain[0].output_ids
    st = spec.speculation
    assert st.proposed > 0 and st.accepted > 0, st


def test_prompt_lookup_sampling_matches_model_distribution(main):
    """The first token is sampled from the prefill; lookup then proposes s(t1), the token that
    followed t1's last occurrence (a point mass), which must come out exactly as often as the
    model alone samples it: P(t2 = s(t1)) = sum p1(t1) p2(s(t1) | t1); and t1 keeps p1."""
    config = dict(deterministic=False, sampling_temperature=1.0, max_generated_tokens=3,
                  force_max_tokens=True)
    engine = Engine(main, sequence_length=1024)
    dist = make_distribution(GenerationConfig(**config))
    rng = np.random.default_rng(0)
    # every token occurs in the prompt, so lookup always proposes
    prompt = [int(t) for t in rng.permutation(engine.vocab_size)] + \
        main.tokenizer.encode("the cat sat on the mat.")
    seq = engine.add_sequence()
    p1 = dist(engine.prefill(seq, prompt)[0], prompt)
    follow, p_follow = {}, 0.0
    for t1 in range(engine.vocab_size):
        engine.trim(seq, len(prompt))
        p2 = dist(engine.decode_step([seq], [t1])[0], prompt + [t1])
        follow[t1] = lookup_continuation(prompt + [t1], 1)[0]
        p_follow += p1[t1] * p2[follow[t1]]
    draws = 1500
    gen = BatchGenerator(Engine(main, sequence_length=1024, max_sequences=16), main.tokenizer, [],
                         speculator=Speculator(PromptLookup(engine.vocab_size),
                                               num_speculative_tokens=2, adaptive=False))
    reqs = [GenerationRequest(prompt, GenerationConfig(seed=i, **config)) for i in range(draws)]
    gen.run(reqs)
    st = gen.speculation
    assert st.proposed == draws and 0 < st.accepted < st.proposed  # both paths exercised
    hits = sum(r.output_ids[1] == follow[r.output_ids[0]] for r in reqs)
    assert hits == st.accepted
    assert stats.binomtest(hits, draws, p_follow).pvalue > 1e-3
    counts = np.bincount([r.output_ids[0] for r in reqs], minlength=engine.vocab_size)
    keep = p1 * draws >= 5
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(p1[keep], p1[~keep].sum()) * draws
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_pipeline_prompt_lookup_option(tiny_model_dir):
    folder = tiny_model_dir("llama")
    kwargs = dict(model_path=folder, sequence_length=128, max_generated_tokens=32)
    base = Pipeline.create(**kwargs)
    assert base.generator.speculator is None
    lookup = Pipeline.create(**kwargs, prompt_lookup=True)
    assert isinstance(lookup.generator.speculator.drafter, PromptLookup)
    assert lookup.generator.speculator.adaptive  # the default
    assert lookup(PROMPTS).sequences == base(PROMPTS).sequences
    assert lookup.generator.speculation.proposed > 0
    both = Pipeline.create(**kwargs, prompt_lookup=True, draft_model_path=folder,
                           adaptive_speculation=False, num_speculative_tokens=3)
    drafter = both.generator.speculator.drafter
    assert isinstance(drafter.fallback, DraftModel) and not both.generator.speculator.adaptive
    assert both(PROMPTS).sequences == base(PROMPTS).sequences
    assert both.generator.speculation.acceptance_rate > 0.5  # the model drafting for itself
