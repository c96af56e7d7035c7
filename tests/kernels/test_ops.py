"""RMSNorm, RoPE, SwiGLU, add, softmax and KV-cache attention against the NumPy twins."""

import numpy as np
import pytest

from sparsellm import kernels
from sparsellm.kernels import reference as ref


@pytest.mark.parametrize("D", [64, 77])
def test_rms_norm(isa, rng, D):
    x = rng.standard_normal((5, D)).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    np.testing.assert_allclose(kernels.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hd", [64, 12])
def test_rope(isa, rng, hd):
    x = rng.standard_normal((6, 3, hd)).astype(np.float32)
    pos = np.array([0, 1, 5, 100, 2047, 7])
    inv = 1.0 / 10000 ** (np.arange(0, hd, 2) / hd)
    np.testing.assert_allclose(kernels.rope(x, pos, inv), ref.rope(x, pos, inv),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("D", [64, 77])
def test_layer_norm(isa, rng, D):
    x = (rng.standard_normal((20, D)) * 3 + 2).astype(np.float32)  # mean far from 0
    w = rng.standard_normal(D).astype(np.float32)
    b = rng.standard_normal(D).astype(np.float32)
    for bias in (b, None):
        np.testing.assert_allclose(kernels.layer_norm(x, w, bias, 1e-5),
                                   ref.layer_norm(x, w, bias, 1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["silu", "gelu_tanh", "gelu", "relu"])
@pytest.mark.parametrize("n", [7, 40000])
def test_activation(isa, rng, name, n):
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    np.testing.assert_allclose(kernels.activation(x, name), ref.activation(x, name),
                               rtol=1e-5, atol=1e-6)


def test_partial_rope(isa, rng):
    """Only the first 2 * len(inv_freq) dims of each head rotate (GPT-NeoX, Phi-2, GPT-J)."""
    x = rng.standard_normal((6, 3, 16)).astype(np.float32)
    pos = np.array([0, 1, 5, 100, 2047, 7])
    inv = 1.0 / 10000 ** (np.arange(0, 8, 2) / 8)
    out = kernels.rope(x, pos, inv)
    np.testing.assert_allclose(out, ref.rope(x, pos, inv), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[..., 8:], x[..., 8:])


@pytest.mark.parametrize("n", [8, 1000, 9000])
def test_swiglu_add_softmax(isa, rng, n):
    g = rng.standard_normal(n).astype(np.float32) * 4
    u = rng.standard_normal(n).astype(np.float32)
    np.testing.assert_allclose(kernels.swiglu(g, u), ref.swiglu(g, u), rtol=1e-5, atol=1e-6)
    s = rng.standard_normal((3, n)).astype(np.float32) * 5
    np.testing.assert_allclose(kernels.softmax(s), ref.softmax(s), rtol=5e-5, atol=1e-7)
    x = g.copy()
    kernels.add_(x, u)
    np.testing.assert_array_equal(x, g + u)


@pytest.mark.parametrize("window", [0, 3])
def test_attention_batch_of_sequences(isa, rng, window):
    # 2 slots, GQA 4 query heads over 2 kv heads; slot 1 prefills 5 tokens, slot 0 decodes 1.
    S, KV, cap, hd, H = 2, 2, 16, 20, 4
    kc = rng.standard_normal((S, KV, cap, hd)).astype(np.float32)
    vc = rng.standard_normal((S, KV, cap, hd)).astype(np.float32)
    slots = np.array([1, 1, 1, 1, 1, 0])
    pos = np.array([3, 4, 5, 6, 7, 11])
    q = rng.standard_normal((6, H, hd)).astype(np.float32)
    scale = hd ** -0.5
    np.testing.assert_allclose(kernels.attention(q, kc, vc, slots, pos, scale, window),
                               ref.attention(q, kc, vc, slots, pos, scale, window),
                               rtol=1e-5, atol=1e-5)


def test_to_half_rounds_like_numpy(isa, rng):
    # Random magnitudes across the half range, its subnormals, overflow, ties and signed zeros.
    x = np.concatenate([
        rng.standard_normal(1001) * 10.0 ** rng.integers(-9, 6, 1001),
        [0.0, -0.0, 65504.0, 65519.9, 65520.0, -1e6, np.inf, -np.inf, 2.0 ** -24, 2.0 ** -25,
         3 * 2.0 ** -26, 2.0 ** -14 - 2.0 ** -25, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11],
    ]).astype(np.float32)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16)
    np.testing.assert_array_equal(kernels.to_half(x).view(np.uint16), expected.view(np.uint16))


@pytest.mark.parametrize("hd", [64, 20])
def test_attention_over_a_half_precision_cache(isa, rng, hd):
    S, KV, cap, H = 2, 2, 40, 6
    kc = rng.standard_normal((S, KV, cap, hd)).astype(np.float16)
    vc = rng.standard_normal((S, KV, cap, hd)).astype(np.float16)
    slots = np.array([0, 0, 1])
    pos = np.array([30, 31, 7])
    q = rng.standard_normal((3, H, hd)).astype(np.float32)
    got = kernels.attention(q, kc, vc, slots, pos, hd ** -0.5)
    np.testing.assert_allclose(got, ref.attention(q, kc, vc, slots, pos, hd ** -0.5),
                               rtol=1e-5, atol=1e-5)
    # The same cache widened to fp32 gives the same numbers: only storage differs.
    np.testing.assert_allclose(got, kernels.attention(q, kc.astype(np.float32),
                                                      vc.astype(np.float32), slots, pos,
                                                      hd ** -0.5), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="same dtype"):
        kernels.attention(q, kc, vc.astype(np.float32), slots, pos, 0.1)


@pytest.mark.parametrize("hd", [64, 96, 20])
def test_int8_kv_rows_match_the_numpy_twin(isa, rng, hd):
    # Values quantized like W8A8 activations, then the float32 scale; a zero row has scale 0.
    x = (rng.standard_normal((50, hd)) * 10.0 ** rng.integers(-3, 3, (50, 1))).astype(np.float32)
    x[7] = 0
    rows = kernels.to_kv_int8(x)
    np.testing.assert_array_equal(rows, ref.kv_int8_rows(x))
    half_step = np.abs(x).max(1, keepdims=True) / 254  # scale / 2
    assert (np.abs(ref.kv_dequantize(rows) - x) <= half_step * 1.001).all()


def kv_caches(rng, shape, dtype):
    """Random K and V caches of `dtype` (int8: rows with scales) -> (kc, vc, want_k, want_v),
    want_* being what attention should see: the dequantized values for int8."""
    kc, vc = (rng.standard_normal(shape) for _ in range(2))
    if dtype == np.int8:
        kc, vc = ref.kv_int8_rows(kc), ref.kv_int8_rows(vc)
        return kc, vc, ref.kv_dequantize(kc), ref.kv_dequantize(vc)
    kc, vc = kc.astype(dtype), vc.astype(dtype)
    return kc, vc, kc, vc


@pytest.mark.parametrize("H, KV", [(9, 3), (10, 2), (8, 2), (4, 4)])
@pytest.mark.parametrize("hd", [64, 20])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8])
def test_attention_over_groups_of_heads(isa, rng, threads, H, KV, hd, dtype):
    # Enough tokens x KV heads that a task is all the query heads sharing a KV head (blocks of
    # 3, 2 and 1 heads), over key counts that are and are not multiples of 4. int8: cache rows
    # with scales, against attention over their dequantized values.
    kc, vc, want_k, want_v = kv_caches(rng, (3, KV, 128, hd), dtype)
    slots = np.array([0, 1, 1, 2, 0])
    pos = np.array([0, 3, 4, 37, 101])
    q = rng.standard_normal((5, H, hd)).astype(np.float32)
    for n in (1, 2):
        threads(n)
        np.testing.assert_allclose(kernels.attention(q, kc, vc, slots, pos, hd ** -0.5),
                                   ref.attention(q, want_k, want_v, slots, pos, hd ** -0.5),
                                   rtol=1e-5, atol=1e-5)
    if dtype == np.int8:
        with pytest.raises(ValueError, match="hd \\+ 4|head_dim"):
            kernels.attention(q, kc[..., :hd].copy(), vc[..., :hd].copy(), slots, pos, 0.1)


@pytest.mark.parametrize("H, KV", [(9, 3), (8, 1), (4, 4)])
@pytest.mark.parametrize("hd", [64, 80, 16])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8])
def test_prompt_attention_in_blocks_of_queries(isa, rng, threads, H, KV, hd, dtype):
    """Prompt chunks (AVX2 and AVX-512: blocks of up to 16 consecutive queries of a sequence
    against its keys): the reference's values, and each token's result bitwise the same whatever
    block, chunk split or thread count it runs in. The portable path runs the per-token kernel
    either way."""
    kc, vc, want_k, want_v = kv_caches(rng, (2, KV, 160, hd), dtype)
    # sequence 1 from position 40 (37 tokens: blocks of 16, 16, 5), sequence 0 from 0 (20)
    slots = np.array([1] * 37 + [0] * 20)
    pos = np.concatenate([np.arange(40, 77), np.arange(20)])
    q = rng.standard_normal((len(pos), H, hd)).astype(np.float32)
    scale = hd ** -0.5
    threads(2)
    got = kernels.attention(q, kc, vc, slots, pos, scale, prompt=True)
    np.testing.assert_allclose(got, ref.attention(q, want_k, want_v, slots, pos, scale),
                               rtol=1e-5, atol=1e-5)
    per_token = kernels.attention(q, kc, vc, slots, pos, scale)
    assert np.array_equal(got, per_token) == (isa == "scalar")  # the blocked kernel ran
    threads(1)
    np.testing.assert_array_equal(kernels.attention(q, kc, vc, slots, pos, scale, prompt=True),
                                  got)
    for a, b in ((0, 17), (17, 37), (37, 57), (3, 4), (50, 52)):  # other blocks, single tokens
        np.testing.assert_array_equal(
            kernels.attention(q[a:b], kc, vc, slots[a:b], pos[a:b], scale, prompt=True),
            got[a:b])


@pytest.mark.parametrize("H, KV", [(9, 3), (8, 2), (4, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8])
@pytest.mark.parametrize("window", [0, 300])
def test_decode_attention_split_over_parts_of_the_keys(isa, rng, threads, H, KV, dtype, window):
    # Decode steps with fewer groups of heads than the threads want split each group's keys
    # into parts whose softmax pieces are merged after (flash-decoding): long contexts, a short
    # one (parts of a few keys) and one of 3 keys (some parts empty), on 2 and 3 threads.
    hd = 64
    kc, vc, want_k, want_v = kv_caches(rng, (2, KV, 1024, hd), dtype)
    for n in (2, 3):
        threads(n)
        for slots, pos in [([0], [1000]), ([1], [130]), ([0, 1], [700, 2])]:
            slots, pos = np.array(slots), np.array(pos)
            q = rng.standard_normal((len(pos), H, hd)).astype(np.float32)
            np.testing.assert_allclose(
                kernels.attention(q, kc, vc, slots, pos, hd ** -0.5, window),
                ref.attention(q, want_k, want_v, slots, pos, hd ** -0.5, window),
                rtol=1e-5, atol=1e-5)


def test_attention_matches_model_reference(rng):
    # The model's own NumPy attention (one sequence, keys 0..L-1) is the same math.
    from sparsellm.models.decoder import attention as model_attention

    KV, L, hd, H = 2, 9, 16, 6
    k = rng.standard_normal((1, KV, L, hd)).astype(np.float32)
    v = rng.standard_normal((1, KV, L, hd)).astype(np.float32)
    pos = np.arange(5, 9)
    q = rng.standard_normal((4, H, hd)).astype(np.float32)
    got = kernels.attention(q, k, v, np.zeros(4, np.int64), pos, 0.25)
    np.testing.assert_allclose(got, model_attention(q, k[0], v[0], pos, 0.25), rtol=1e-5,
                               atol=1e-5)


def test_threads_and_isa_settings():
    n = kernels.get_num_threads()
    kernels.set_num_threads(1)
    assert kernels.get_num_threads() == 1
    kernels.set_num_threads(0)
    assert kernels.get_num_threads() >= 1
    kernels.set_num_threads(n)
    with pytest.raises(ValueError, match="accepted"):
        kernels.set_isa("neon")
