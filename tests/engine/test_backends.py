"""The native engine equals the NumPy reference engine on the same weights, format by format."""

from __future__ import annotations

import time

import numpy as np
import pytest

from sparsellm.engine import Engine
from sparsellm.models import load_checkpoint

# Formats whose NumPy twin is exact (fp32 activations); `_a8` ones quantize activations too.
EXACT_FORMATS = ["fp32", "fp16", "int8", "int4_g32", "int4_g64_asym", "sparse_int8",
                 "sparse_int4_g32"]


def _pruned_2_4(checkpoint):
    """A copy whose linear weights keep the 2 largest of every 4 (a valid 2:4 pattern)."""
    tensors = dict(checkpoint.tensors)
    names = checkpoint.linear_weight_names
    for name in names:
        if name == "lm_head.weight" and name not in checkpoint.tensors:
            continue
        w = checkpoint.tensors[name]
        groups = np.abs(w).reshape(w.shape[0], -1, 4)
        keep = np.argsort(groups, axis=-1)[..., 2:]
        mask = np.zeros_like(groups, dtype=bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        tensors[name] = w * mask.reshape(w.shape)
    return checkpoint.with_tensors(tensors)


def _greedy(engine: Engine, ids: list[int], n: int,
            forced: list[int] | None = None) -> tuple[list[int], np.ndarray]:
    """Greedy tokens and all logits rows (prefill + decode); `forced` decodes given tokens."""
    seq = engine.add_sequence()
    logits = engine.prefill(seq, ids, all_logits=True)
    rows, out = [logits], []
    for i in range(n):
        out.append(forced[i] if forced else int(np.argmax(rows[-1][-1])))
        rows.append(engine.decode_step([seq], [out[-1]]))
    engine.release(seq)
    return out, np.concatenate(rows)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_checkpoint(tiny_model_dir("llama"))


@pytest.mark.parametrize("fmt", EXACT_FORMATS)
def test_native_equals_numpy_reference(tiny, token_ids, fmt):
    ids = token_ids(70, seed=1)  # longer than one 64-token prefill chunk
    native = Engine(tiny, sequence_length=128, weights=fmt, dynamic_int8=False)
    numpy_ = Engine(tiny, sequence_length=128, weights=fmt, backend="numpy")
    a, la = _greedy(native, ids, 24)
    b, lb = _greedy(numpy_, ids, 24)
    assert a == b
    np.testing.assert_allclose(la, lb, atol=2e-4 * np.abs(lb).max())


@pytest.mark.parametrize("fmt", ["2:4_int8", "2:4_int8_a8", "sparse_int8_a8", "int8_a8",
                                 "int4_g32_a8", "int4_g32", "int4_g128_asym",
                                 "sparse_int4_g32", "int8"])
def test_activation_quantized_and_2_4_formats_track_the_reference(tiny, token_ids, fmt):
    model = _pruned_2_4(tiny) if fmt.startswith("2:4") else tiny
    ids = token_ids(40, seed=2)
    tokens, lb = _greedy(Engine(model, sequence_length=96, weights=fmt, backend="numpy"), ids, 16)
    _, la = _greedy(Engine(model, sequence_length=96, weights=fmt), ids, 16, forced=tokens)
    if fmt == "2:4_int8":  # weight-only: the twin's logits, with fp32 activations throughout
        _, le = _greedy(Engine(model, sequence_length=96, weights=fmt, dynamic_int8=False), ids,
                        16, forced=tokens)
        np.testing.assert_allclose(le, lb, atol=2e-4 * np.abs(lb).max())
    # int8 activations (dynamic, per token; for a weight-only format's prompt, and dense int4's
    # and int8's decode on AVX2, per group of columns) perturb the logits; the NumPy twin keeps
    # fp32 ones.
    # Compare what matters: the relative error is small and the predictions mostly agree.
    err = np.linalg.norm(la - lb, axis=-1) / np.linalg.norm(lb, axis=-1)
    assert err.mean() < 0.05, err.mean()
    assert (la.argmax(-1) == lb.argmax(-1)).mean() > 0.9


def test_half_precision_kv_cache(tiny, token_ids):
    """An fp16 cache: the native engine equals the NumPy reference on the same fp16 cache, and
    stays close to the fp32 cache (keys and values only lose their low mantissa bits)."""
    ids = token_ids(70, seed=3)
    native = Engine(tiny, sequence_length=128, kv_cache_dtype="fp16")
    assert native.cache.k.dtype == np.float16
    a, la = _greedy(native, ids, 24)
    b, lb = _greedy(Engine(tiny, sequence_length=128, kv_cache_dtype="fp16", backend="numpy"),
                    ids, 24)
    assert a == b
    # A key the two engines compute a last bit apart can round to neighbouring halves.
    np.testing.assert_allclose(la, lb, atol=2e-3 * np.abs(lb).max())
    _, lf = _greedy(Engine(tiny, sequence_length=128), ids, 24, forced=a)
    np.testing.assert_allclose(la, lf, atol=1e-2 * np.abs(lf).max())
    assert native.cache.nbytes == Engine(tiny, sequence_length=128).cache.nbytes // 2
    with pytest.raises(ValueError, match="unknown kv_cache_dtype 'int4'.*fp16"):
        Engine(tiny, kv_cache_dtype="int4")


def test_int8_kv_cache(tiny, token_ids):
    """An int8 cache (per-token, per-head scales): close to the fp32 cache, a quarter of its
    bytes plus the scales; the NumPy backend does not offer it."""
    ids = token_ids(70, seed=3)
    native = Engine(tiny, sequence_length=128, kv_cache_dtype="int8")
    a, la = _greedy(native, ids, 24)
    _, lf = _greedy(Engine(tiny, sequence_length=128), ids, 24, forced=a)
    np.testing.assert_allclose(la, lf, atol=5e-2 * np.abs(lf).max())
    assert (la.argmax(-1) == lf.argmax(-1)).mean() > 0.9
    hd = tiny.args.head_dim
    assert native.cache.k.dtype == np.int8 and native.cache.k.shape[-1] == hd + 4
    assert native.cache.nbytes * 4 * hd == Engine(tiny, sequence_length=128).cache.nbytes * (hd + 4)
    with pytest.raises(ValueError, match="int8.*native backend"):
        Engine(tiny, kv_cache_dtype="int8", backend="numpy")


def test_weight_bytes_follow_the_format(tiny):
    fp32 = Engine(tiny, sequence_length=16).weight_bytes_per_step
    int8 = Engine(tiny, sequence_length=16, weights="int8").weight_bytes_per_step
    assert 0.24 < int8 / fp32 < 0.3


def test_unknown_format_and_backend_are_clear_errors(tiny):
    with pytest.raises(ValueError, match="unknown weights format 'int3'.*accepted"):
        Engine(tiny, weights="int3")
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        Engine(tiny, backend="gpu")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["fp32", "int8", "int4_g32"])
def test_smollm2_greedy_native_equals_numpy(smollm2_checkpoint, fmt):
    ids = smollm2_checkpoint.tokenizer.encode("def fibonacci(n):\n    ")
    a, _ = _greedy(Engine(smollm2_checkpoint, sequence_length=64, weights=fmt,
                          dynamic_int8=False), ids, 32)
    b, _ = _greedy(Engine(smollm2_checkpoint, sequence_length=64, weights=fmt, backend="numpy"),
                   ids, 32)
    assert a == b


def test_native_seconds_count_the_time_inside_the_native_forward(tiny, token_ids):
    """What the benchmark's "Time Outside Native Forward" is made of: each step adds its native
    call's wall time (at most the step's), chunked prefills every chunk's; no native backend,
    no native time."""
    native = Engine(tiny, sequence_length=128)
    seq = native.add_sequence()
    assert native.native_seconds == 0.0
    for step in (lambda: native.prefill(seq, token_ids(70, seed=2)),  # two prefill chunks
                 lambda: native.decode_step([seq], [5])):
        before, start = native.native_seconds, time.perf_counter()
        step()
        wall = time.perf_counter() - start
        assert 0 < native.native_seconds - before <= wall
    numpy_ = Engine(tiny, sequence_length=128, backend="numpy")
    _greedy(numpy_, token_ids(8, seed=3), 2)
    assert numpy_.native_seconds == 0.0
