"""Prompt logits taken window by window (issue 55 item 4): `score_prompt` and `return_logits`
give the same bits as one prefill of the whole prompt, and scoring a long prompt holds one
chunk of logits at a time, not the prompt's (tokens, vocab) array."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from sparsellm.engine import Engine
from sparsellm.generation import BatchGenerator, GenerationConfig, GenerationRequest
from sparsellm.generation.generator import _logprobs
from sparsellm.models import load_checkpoint

CHUNK = 8
# fed tokens (score-only feeds the prompt minus its last token): shorter than a chunk, exactly
# one, two and a 1-token remainder, three and an odd remainder of 5
PROMPT_LENGTHS = [5, 9, 17, 30]


@pytest.fixture(scope="module")
def ck(tiny_model_dir):
    return load_checkpoint(tiny_model_dir("llama"))


def whole_prompt_logits(ck, ids: list[int]) -> np.ndarray:
    """(len(ids), vocab): one prefill of every token, as the generator fed prompts before."""
    engine = Engine(ck, sequence_length=64, prompt_processing_sequence_length=CHUNK)
    return engine.prefill(engine.add_sequence(), ids, all_logits=True)


def generator(ck, max_sequences: int = 1) -> BatchGenerator:
    return BatchGenerator(Engine(ck, sequence_length=64, max_sequences=max_sequences,
                                 prompt_processing_sequence_length=CHUNK), ck.tokenizer)


@pytest.mark.parametrize("n", PROMPT_LENGTHS)
def test_scored_prompt_equals_one_whole_prefill(ck, token_ids, n):
    ids = token_ids(n, n)
    whole = whole_prompt_logits(ck, ids[:-1])
    expected = [_logprobs(row, t, 3) for row, t in zip(whole, ids[1:], strict=True)]
    cfg = GenerationConfig(max_generated_tokens=1)
    (only,) = generator(ck).run([GenerationRequest(ids, cfg, logprobs=3, score_prompt=True,
                                                   generate=False)])
    assert only.prompt_logprobs == expected  # the same floats, not close ones
    assert only.output_ids == [] and only.finished_reason == "length"


@pytest.mark.parametrize("n", PROMPT_LENGTHS)
def test_scoring_while_generating_and_return_logits_equal_one_whole_prefill(ck, token_ids, n):
    ids = token_ids(n, 100 + n)
    whole = whole_prompt_logits(ck, ids)
    cfg = GenerationConfig(max_generated_tokens=3, force_max_tokens=True)
    plain, scored, with_logits = generator(ck, max_sequences=3).run([
        GenerationRequest(ids, cfg),
        GenerationRequest(ids, cfg, logprobs=2, score_prompt=True),
        GenerationRequest(ids, cfg, return_logits=True)])
    assert scored.prompt_logprobs == [_logprobs(row, t, 2)
                                      for row, t in zip(whole[:-1], ids[1:], strict=True)]
    assert scored.token_logprobs[0] == _logprobs(whole[-1], scored.output_ids[0], 2)
    assert scored.output_ids == plain.output_ids == with_logits.output_ids
    assert scored.output_ids[0] == int(np.argmax(whole[-1]))
    rows = np.concatenate(with_logits.logits)
    assert rows.shape == (n + 3, ck.args.vocab_size)
    np.testing.assert_array_equal(rows[:n], whole)


def test_scoring_a_long_prompt_holds_one_chunk_of_logits(tiny_model_dir, token_ids):
    """A 128k vocabulary (Llama 3.2's): one chunk of 16 tokens' logits is 8 MB, the 96 scored
    tokens' 49 MB; the peak of everything NumPy and Python allocate while scoring stays under
    two chunks (before, the chunks and their concatenation: ~98 MB)."""
    ck = load_checkpoint(tiny_model_dir("llama32"))
    chunk, n = 16, 97
    engine = Engine(ck, sequence_length=128, prompt_processing_sequence_length=chunk)
    gen = BatchGenerator(engine, ck.tokenizer)
    cfg = GenerationConfig(max_generated_tokens=1)
    warm = GenerationRequest(token_ids(4, 1), cfg, logprobs=1, score_prompt=True, generate=False)
    gen.run([warm])
    request = GenerationRequest(token_ids(n, 2), cfg, logprobs=1, score_prompt=True,
                                generate=False)
    chunk_bytes = chunk * ck.args.vocab_size * 4
    tracemalloc.start()
    try:
        gen.run([request])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(request.prompt_logprobs) == n - 1
    print(f"\npeak {peak / 1e6:.1f} MB, one chunk of logits {chunk_bytes / 1e6:.1f} MB, "
          f"the whole prompt's {(n - 1) * ck.args.vocab_size * 4 / 1e6:.1f} MB")
    assert chunk_bytes <= peak < 2 * chunk_bytes
