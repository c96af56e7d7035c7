"""Engine: KV-cache bookkeeping, chunked prefill, trim/rollback, batched decode, capacity."""

from __future__ import annotations

import numpy as np
import pytest

from sparsellm.engine import ContextLengthError, Engine
from sparsellm.models import load_checkpoint

ATOL = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir):
    return load_checkpoint(tiny_model_dir("qwen2"))


def test_prefill_trim_reprefill_gives_same_logits(checkpoint, token_ids):
    a, b = token_ids(30, seed=1), token_ids(12, seed=2)
    engine = Engine(checkpoint, sequence_length=64, prompt_processing_sequence_length=8)
    seq = engine.add_sequence()
    first = engine.prefill(seq, a, all_logits=True)
    engine.prefill(seq, b)  # speculative tokens ...
    assert engine.length(seq) == 42
    engine.trim(seq, 20)  # ... rolled back
    assert engine.length(seq) == 20
    rerun = engine.prefill(seq, a[20:], all_logits=True)
    np.testing.assert_allclose(rerun, first[20:], atol=ATOL, rtol=0)
    fresh = Engine(checkpoint, sequence_length=64)
    s = fresh.add_sequence()
    expected = fresh.prefill(s, a[:20] + b, all_logits=True)[20:]
    engine.trim(seq, 20)
    np.testing.assert_allclose(engine.prefill(seq, b, all_logits=True), expected, atol=ATOL,
                               rtol=0)


def test_prompt_chunking_does_not_change_prompt_logits(checkpoint, token_ids):
    """A prompt's logits are the same bits whatever chunks it runs in (chunks above the GEMVs'
    8 tokens: the GEMMs and the prompts' blocked attention are batch invariant)."""
    ids = token_ids(50, seed=5)

    def run(chunk):
        engine = Engine(checkpoint, sequence_length=64, prompt_processing_sequence_length=chunk)
        return engine.prefill(engine.add_sequence(), ids, all_logits=True)

    np.testing.assert_array_equal(run(25), run(50))


def test_decode_step_matches_prefill_logits(checkpoint, token_ids):
    ids = token_ids(20, seed=3)
    engine = Engine(checkpoint, sequence_length=32)
    seq = engine.add_sequence()
    full = engine.prefill(seq, ids, all_logits=True)
    engine.trim(seq, 10)
    rows = [engine.decode_step([seq], [t])[0] for t in ids[10:]]
    np.testing.assert_allclose(np.stack(rows), full[10:], atol=ATOL, rtol=0)


def test_batched_decode_equals_separate_sequences(checkpoint, token_ids):
    prompts = [token_ids(n, seed=n) for n in (3, 17, 9, 30)]
    nexts = token_ids(4, seed=99)
    batch = Engine(checkpoint, sequence_length=40, max_sequences=4)
    seqs = [batch.add_sequence() for _ in prompts]
    for s, p in zip(seqs, prompts, strict=True):
        batch.prefill(s, p)
    batched = batch.decode_step(seqs, nexts)
    for i, (p, t) in enumerate(zip(prompts, nexts, strict=True)):
        alone = Engine(checkpoint, sequence_length=40)
        s = alone.add_sequence()
        expected = alone.prefill(s, p + [t])
        np.testing.assert_allclose(batched[i], expected[0], atol=ATOL, rtol=0)
    # a step mixing a multi-token extension and a single token, in any slot order
    mixed = batch.step([seqs[3], seqs[0]], [[5, 6, 7], [8]], np.array([2, 3]))
    alone = Engine(checkpoint, sequence_length=40)
    s = alone.add_sequence()
    np.testing.assert_allclose(mixed[0], alone.prefill(s, prompts[3] + [nexts[3], 5, 6, 7])[0],
                               atol=ATOL, rtol=0)


def test_context_length_errors(checkpoint):
    engine = Engine(checkpoint, sequence_length=8)
    seq = engine.add_sequence()
    with pytest.raises(ContextLengthError, match="sequence needs 9 tokens but sequence_length "
                                                 "is 8") as info:
        engine.prefill(seq, list(range(3, 12)))
    assert (info.value.prompt_tokens, info.value.limit) == (9, 8)
    assert engine.length(seq) == 0  # nothing was written
    engine.prefill(seq, list(range(3, 11)))
    with pytest.raises(ContextLengthError, match="needs 9 tokens"):
        engine.decode_step([seq], [3])


def test_bad_tokens_and_arguments(checkpoint):
    engine = Engine(checkpoint, sequence_length=8)
    seq = engine.add_sequence()
    with pytest.raises(ValueError, match=r"token id out of range \[0, 400\)"):
        engine.prefill(seq, [1, 400])
    with pytest.raises(ValueError, match="prefill needs at least one token"):
        engine.prefill(seq, [])
    with pytest.raises(ValueError, match="cannot trim slot 0 of 0 tokens to 3"):
        engine.trim(seq, 3)
    with pytest.raises(ValueError, match="must be positive"):
        Engine(checkpoint, sequence_length=0)


def test_slots_are_limited_and_reused(checkpoint):
    engine = Engine(checkpoint, sequence_length=8, max_sequences=2)
    a, b = engine.add_sequence(), engine.add_sequence()
    assert {a, b} == {0, 1} and engine.max_sequences == 2
    with pytest.raises(RuntimeError, match="all 2 KV-cache slots are in use"):
        engine.add_sequence()
    engine.prefill(a, [5, 6])
    engine.release(a)
    assert engine.add_sequence() == a and engine.length(a) == 0
    assert engine.cache.nbytes == 2 * 2 * 2 * 2 * 8 * 16 * 4  # k+v, layers, slots, kv, cap, hd


def _resident_mb() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 1e6


def test_kv_cache_memory_becomes_resident_as_it_fills():
    from sparsellm.engine.kv_cache import KVCache

    before = _resident_mb()
    cache = KVCache(30, 2, 3, 2048, 64)  # 2 x 94 MB
    cache.k[:, :, :, 0] = 1.0  # the first token of every (layer, slot, head)
    cache.v[:, :, :, 0] = 1.0
    assert _resident_mb() - before < 20
    assert cache.nbytes == 2 * 30 * 2 * 3 * 2048 * 64 * 4
    assert cache.k[:, :, :, 1:].max() == 0 and cache.k.flags.writeable


def test_stored_tensors_are_read_only_views_of_the_mapped_file(checkpoint):
    """Nothing is read into private memory at load: a float32 file's tensors are views of its
    memory map (shared page cache), and a caller cannot write through them to the file."""
    name = "model.layers.0.mlp.up_proj.weight"
    a, b = checkpoint.stored[name], checkpoint.stored[name]
    assert a.dtype == np.float32 and np.shares_memory(a, b)
    assert not a.flags.writeable and not a.flags.owndata
    with pytest.raises(ValueError, match="read-only"):
        a[0, 0] = 1.0
