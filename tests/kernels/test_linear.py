"""Every packed format x both ISAs x GEMV/GEMM against the NumPy reference twins."""

import numpy as np
import pytest

from sparsellm import kernels
from sparsellm.kernels import reference as ref
from sparsellm.kernels.formats import FORMATS, parse_format
from sparsellm.kernels.layouts import Sparsity

# (out, in): odd sizes exercise row splits across threads and column padding to 64.
SHAPES = [(37, 96), (64, 200), (5, 64)]
TOKENS = [1, 2, 3, 5, 8, 17]  # <= 8: multi-token GEMV; 17: decoded-panel GEMM


def random_weight(rng, shape, fmt):
    w = rng.standard_normal(shape).astype(np.float32) * 0.1
    sparsity = parse_format(fmt).sparsity
    if sparsity is Sparsity.TWO_FOUR:
        # keep the 2 largest of every 4 (pad the last partial group with pruned columns)
        out, cols = shape
        cp = -(-cols // 4) * 4
        wp = np.zeros((out, cp), np.float32)
        wp[:, :cols] = w
        g = np.abs(wp).reshape(out, -1, 4)
        keep = np.argsort(g, axis=2)[:, :, 2:]
        m = np.zeros_like(g, dtype=bool)
        np.put_along_axis(m, keep, True, axis=2)
        return w, m.reshape(out, cp)[:, :cols]
    if sparsity is Sparsity.BITMASK:
        return w, rng.random(shape) < 0.5
    return w, None


def tolerance(fmt):
    # fp32 accumulation order differs between kernels and the float64 reference
    return dict(rtol=2e-4, atol=2e-4) if parse_format(fmt).act_int8 else dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_linear_matches_reference(isa, rng, fmt, shape):
    w, mask = random_weight(rng, shape, fmt)
    p = kernels.pack(w, fmt, mask)
    for T in TOKENS:
        x = rng.standard_normal((T, shape[1])).astype(np.float32)
        for prompt in (False, True):
            for dyn in (False, True):  # dynamic_int8: dense int4's x per group on AVX2
                np.testing.assert_allclose(
                    kernels.linear(x, p, prompt=prompt, dynamic_int8=dyn),
                    ref.linear_as_run(x, p, prompt, dyn), **tolerance(fmt),
                    err_msg=f"{fmt} {shape} T={T} {isa} prompt={prompt} dynamic_int8={dyn}")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(37, 96), (5, 200)])
@pytest.mark.parametrize("dyn", [False, True])
def test_each_token_is_bitwise_independent_of_the_batch(isa, rng, fmt, shape, dyn):
    """Batched decode / speculative verification give every token exactly its T == 1 result
    (with dynamic_int8 too: each token's x is quantized on its own)."""
    w, mask = random_weight(rng, shape, fmt)
    p = kernels.pack(w, fmt, mask)
    # 8 for fp32 activations; int8 activations: 32 (AVX2), 8-40 (AVX-512), unlimited (scalar);
    # every T for a GEMV on x quantized per group that no GEMM shares (AVX2 weight-only int8)
    native = p.native()
    group = native.group_int8_act_group if dyn else -1
    every_t = group > 0 and native.int8_gemm_act_group != group
    limit = 40 if every_t else min(native.gemv_max_tokens, 40)
    assert limit >= 8
    x = rng.standard_normal((limit, shape[1])).astype(np.float32) * 3
    alone = np.concatenate([kernels.linear(x[t:t + 1], p, dynamic_int8=dyn)
                            for t in range(limit)])
    for T in sorted({1, 2, 3, 5, 8, 20, limit} & set(range(1, limit + 1))):
        batch = kernels.linear(x[:T], p, dynamic_int8=dyn)
        np.testing.assert_array_equal(batch, alone[:T], err_msg=f"{fmt} {shape} T={T} {isa}")
    # A token's result does not depend on its neighbours either.
    shuffled = kernels.linear(x[::-1].copy(), p, dynamic_int8=dyn)[::-1]
    np.testing.assert_array_equal(shuffled, alone)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantized_weights_are_close_to_the_original(rng, fmt):
    w, mask = random_weight(rng, (16, 128), fmt)
    p = kernels.pack(w, fmt, mask)
    target = w if mask is None else w * mask
    s = parse_format(fmt)
    rtol = {"fp16": 2 ** -11, "bf16": 2 ** -8}.get(s.kind, 0)  # half an ulp of the storage type
    atol = 0 if s.is_float else None
    if atol is None:  # quantized: half a step of the coarsest scale
        atol = 0.5 * np.abs(w).max() / (7 if s.bits == 4 else 127) + 1e-7
        if s.asym:
            atol *= 2
    np.testing.assert_allclose(ref.dequantize(p), target, rtol=rtol, atol=atol)
    if mask is not None:
        assert (ref.dequantize(p)[~mask] == 0).all()


def test_sparse_bytes_shrink_with_density(rng):
    w = rng.standard_normal((64, 256)).astype(np.float32)
    mask = rng.random(w.shape) < 0.5
    dense = kernels.pack(w, "int8").nbytes
    sparse = kernels.pack(w, "sparse_int8", mask).nbytes
    s24 = kernels.pack(w, "2:4_int8", random_weight(rng, w.shape, "2:4_int8")[1]).nbytes
    # 0.5 byte of values + 1/8 byte of mask per weight
    assert sparse < 0.7 * dense and s24 < 0.7 * dense


BITMASK_FORMATS = [f for f in FORMATS if parse_format(f).sparsity is Sparsity.BITMASK]


@pytest.mark.parametrize("fmt", BITMASK_FORMATS)
@pytest.mark.parametrize("density", [0.0, 0.08, 0.92, 1.0])
def test_bitmask_kernels_at_every_density(isa, rng, fmt, density):
    """Empty and full mask bytes and words (8 kept values per byte, 64 nibbles per word) are
    the expansions' edge cases; 50% masks (test_linear_matches_reference) rarely reach them."""
    shape = (19, 320)
    w, _ = random_weight(rng, shape, fmt)
    p = kernels.pack(w, fmt, rng.random(shape) < density)
    for T in (1, 3, 17):
        x = rng.standard_normal((T, shape[1])).astype(np.float32)
        np.testing.assert_allclose(kernels.linear(x, p), ref.linear_as_run(x, p, False),
                                   **tolerance(fmt), err_msg=f"{fmt} {density} T={T} {isa}")


@pytest.mark.parametrize("fmt", ["int8_a8", "sparse_int8_a8", "2:4_int8_a8"])
def test_w8a8_results_are_bitwise_the_same_on_every_isa(rng, fmt):
    """Per-channel W8A8 dot products are exact int32, so the scalar, AVX2 and AVX-512
    (VNNI/VBMI2) kernels agree to the bit: a model gives the same tokens on every CPU. (Int4
    group scales are summed in float, in an ISA-dependent order.)"""
    from sparsellm.kernels._ext import native

    isas = ["scalar", "avx2", "avx512"][:1 + native().cpu_supports_avx2()
                                        + native().cpu_supports_avx512()]
    w, mask = random_weight(rng, (77, 320), fmt)
    p = kernels.pack(w, fmt, mask)
    x = rng.standard_normal((75, 320)).astype(np.float32) * 3
    got = {}
    try:
        for isa in isas:
            kernels.set_isa(isa)
            # above each ISA's GEMV limit (at most 40 tokens) its integer GEMM takes over
            got[isa] = [kernels.linear(x[:T], p) for T in (1, 7, 8, 9, 20, 64, 75)]
    finally:
        kernels.set_isa("auto")
    for isa in isas[1:]:
        for a, b in zip(got[isa], got["scalar"], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{fmt}: {isa} vs scalar")


@pytest.mark.parametrize("fmt", ["int8_a8", "sparse_int8_a8", "2:4_int8_a8"])
def test_w8a8_prompt_gemm_is_exact_at_the_largest_products(isa, rng, fmt):
    """A prompt's W8A8 GEMM gives every token its GEMV bits, the exact int32 dot times the
    scales, where the products are largest: codes of -128 and -127 (odd products, which a float
    sum above 2^24 would round) over two full blocks of 1024 columns and part of a third (AVX2
    sums a block in fp32 FMAs, exact up to 2^24 = 1024 * 128 * 128, then adds the blocks as
    int32), mixed with random codes."""
    out, cols, T = 50, 2 * 1024 + 200, 48  # T: above every ISA's W8A8 GEMV limit
    q = rng.integers(-128, 128, (out, cols)).astype(np.int8)
    q[::2, ::2], q[::2, 1::2] = -128, -127
    mask = random_weight(rng, (out, cols), fmt)[1]
    if mask is not None:
        q = np.where(mask, q, 0).astype(np.int8)
    scale = (rng.random(out) * 0.01 + 0.001).astype(np.float32)
    p = kernels.pack_quantized(q, scale, fmt, mask=mask)
    x = rng.uniform(-1.9, 1.9, (T, cols)).astype(np.float32)
    x[:, 0] = 127.5 / 64  # max|x|: the scale is 1/64 exactly, and -max|x| quantizes to -128
    x[::2, 2::2], x[::2, 1::2] = -127.5 / 64, -127 / 64
    xq, xscale = ref.quantize_activations(x)
    assert (xq[::2, 2::2] == -128).all() and (xq[::2, 1::2] == -127).all()
    y = kernels.linear(x, p, prompt=True)
    gemv = np.stack([kernels.linear(x[t:t + 1], p)[0] for t in range(T)])
    np.testing.assert_array_equal(y, gemv)
    dots = xq.astype(np.int64) @ q.astype(np.int64).T
    assert np.abs(dots).max() > 2 ** 24  # beyond a float sum's exact range
    np.testing.assert_array_equal(
        y, (dots.astype(np.float32) * (xscale[:, None] * scale[None, :])).astype(np.float32))


@pytest.mark.parametrize("fmt", ["int8", "int8_a8", "sparse_int8_a8", "2:4_int8_a8"])
def test_int8_weights_may_be_minus_128(isa, rng, fmt):
    """compressed-tensors' symmetric grids (max / 127.5) give -128 weights and activations:
    every kernel multiplies them exactly."""
    out, cols = 48, 192
    q = rng.integers(-128, 128, (out, cols)).astype(np.int8)
    q[:, ::5] = -128
    mask = random_weight(rng, (out, cols), fmt)[1]
    if mask is not None:
        q = np.where(mask, q, 0).astype(np.int8)
    scale = (rng.random(out) * 0.01 + 0.001).astype(np.float32)
    p = kernels.pack_quantized(q, scale, fmt, mask=mask)
    np.testing.assert_array_equal(ref.dequantize(p)[:, :cols] == 0, q == 0)
    x = np.clip(rng.standard_normal((9, cols)), -1.9, 1.9).astype(np.float32)
    x[:, ::5] = -127.5 / 64  # -max|x|: the scale is 1/64 exactly and these codes are -128,
    x[:4, 1::5] = 127.5 / 64  # under weights of -128 too; +max|x| rounds to 128, clamped
    assert (ref.quantize_activations(x)[0][:, ::5] == -128).all()
    for T in (1, 4, 9):
        np.testing.assert_allclose(kernels.linear(x[:T], p), ref.linear_as_run(x[:T], p),
                                   **tolerance(fmt))


def _activation_rows(rng, n):
    """Token rows that stress per-token int8: random, an outlier, all-equal, ties, zero, tiny."""
    x = rng.standard_normal((8, n)).astype(np.float32)
    x[1, 7] = 300.0  # one outlier: the rest of the row quantizes to a few levels
    x[2] = 0.37  # all-equal rows: every value is the row's max
    x[3] = -2.5
    x[4] = 0.0  # scale 0, codes 0
    x[5, :] = 0.5  # with max 127.5 the scale is 1: x / scale is exactly k + 0.5, rounded half
    x[5, 0] = 127.5  # to even (and 127.5 itself to 128, clipped to 127)
    x[5, 1:7] = [2.5, 3.5, -2.5, -3.5, 126.5, -127.5]
    x[6] *= 1e-30  # tiny but nonzero
    x[7, ::2] *= -40.0
    return x


@pytest.mark.parametrize("n", [128, 200])  # 200: not a multiple of 32 before padding
def test_activation_quantization_twin(isa, rng, n):
    """The kernels' per-token int8 activation quantization equals the NumPy twin
    (`reference.quantize_activations`) to within one LSB: read through an identity W8A8 weight,
    y[t, i] = xq[t, i] * xscale[t] exactly (weight scale 1/127, codes 127)."""
    p = kernels.pack(np.eye(n, dtype=np.float32), "int8_a8")
    unit = np.diag(ref.dequantize(p))  # 127 * float32(1 / 127) per output channel
    x = _activation_rows(rng, n)
    y = kernels.linear(x, p)
    xq, scale = ref.quantize_activations(x)
    assert xq.dtype == np.int8 and xq.max() == 127 and xq.min() == -128
    # compressed-tensors' grid: max / 127.5, and -max (-127.5 -> -128) clipped to -127
    np.testing.assert_array_equal(scale[[2, 3, 4, 5]], [np.float32(0.37) / np.float32(127.5),
                                                        np.float32(2.5) / np.float32(127.5), 0, 1])
    assert (xq[2] == 127).all() and (xq[3] == -127).all() and not xq[4].any()
    assert xq[5, :7].tolist() == [127, 2, 4, -2, -4, 126, -128]  # ties to even, then clamped
    assert xq[1, 7] == 127 and np.abs(np.delete(xq[1], 7)).max() <= 2
    live = scale > 0
    codes = np.zeros_like(y)
    codes[live] = y[live] / (scale[live, None] * unit[None, :])
    assert np.abs(codes - np.rint(codes)).max() < 1e-3  # y really is codes times the scale
    codes = np.rint(codes).astype(np.int32)
    assert np.abs(codes - xq).max() <= 1, f"{isa}: more than one LSB apart"
    assert (codes != xq).mean() < 0.01, f"{isa}: LSB flips on many values"
    assert not y[4].any()  # all-zero token: scale 0, output 0
    np.testing.assert_allclose(y, ref.linear(x, p), rtol=0, atol=1.01 * scale.max())


@pytest.mark.parametrize("n", [128, 200])
@pytest.mark.parametrize("fmt", ["int4_g32", "sparse_int4_g32", "int8", "sparse_int8"])
def test_int8_gemm_activation_quantization_twin(isa, rng, n, fmt):
    """Weight-only prompts in the integer GEMMs (AVX-512: every integer format; AVX2: int4,
    dense and bitmask) quantize x per group of 32 columns (int4: its weight group;
    `reference.quantize_activation_groups`, scale max / 127): read through an identity weight,
    y[t, i] = xq[t, i] * scale[t, i / 32] * w[i, i] to a few ulp, and the codes are the twin's
    exactly. (The portable path, and AVX2 for the other formats, keep fp32 panels.)"""
    eye = np.eye(n, dtype=np.float32)
    p = kernels.pack(eye, fmt, eye != 0 if fmt.startswith("sparse") else None)
    if not (isa == "avx512" or isa == "avx2" and "int4" in fmt):
        assert p.native().int8_gemm_act_group == -1
        np.testing.assert_array_equal(kernels.linear(eye[:20], p, prompt=True),
                                      ref.dequantize(p)[:, :20].T)
        return
    assert p.native().int8_gemm_act_group == 32
    x = np.concatenate([_activation_rows(rng, n),
                        rng.standard_normal((10, n)).astype(np.float32)])
    x[8, 40:70] = 0.0  # a zero group next to live ones
    y = kernels.linear(x, p, prompt=True)
    kp = -(-n // 64) * 64
    xp = np.zeros((len(x), kp), np.float32)
    xp[:, :n] = x
    xq, scale = ref.quantize_activation_groups(xp, 32)
    assert np.abs(xq).max() == 127
    col_scale = np.repeat(scale, 32, axis=1)[:, :n]
    live = col_scale > 0
    codes = np.zeros_like(y)
    codes[live] = y[live] / col_scale[live] / np.diag(ref.dequantize(p))[np.nonzero(live)[1]]
    np.testing.assert_allclose(codes, xq[:, :n], rtol=0, atol=1e-3)
    assert not y[~live].any()
    np.testing.assert_allclose(y, ref.linear(x, p, act_group=32), rtol=1e-6, atol=0)


def test_bad_inputs_raise_actionable_errors(rng):
    with pytest.raises(ValueError, match="accepted"):
        kernels.pack(np.zeros((4, 64), np.float32), "int3")
    with pytest.raises(ValueError, match="more than 2"):
        kernels.pack(np.ones((4, 64), np.float32), "2:4_int8", np.ones((4, 64), bool))
    with pytest.raises(ValueError, match="dense"):
        kernels.pack(np.ones((4, 64), np.float32), "int8", np.ones((4, 64), bool))
    p = kernels.pack(np.ones((4, 64), np.float32), "fp32")
    with pytest.raises(ValueError, match="x must be"):
        kernels.linear(np.ones((2, 65), np.float32), p)


# the formats that leave the GEMV above some T on some ISA (fp32 activations everywhere; int8
# activations for the integer GEMMs of AVX2 and AVX-512; int4 W4A8 for the scalar fp32 GEMM)
def _gemv_limit(fmt: str) -> int:
    w, mask = random_weight(np.random.default_rng(0), (16, 64), fmt)
    limits = []
    for isa in ("scalar", "auto"):
        kernels.set_isa(isa)
        try:
            limits.append(kernels.pack(w, fmt, mask).native().gemv_max_tokens)
        finally:
            kernels.set_isa("auto")
    return min(limits)


GEMM_FORMATS = [f for f in FORMATS if _gemv_limit(f) < 40]


@pytest.mark.parametrize("fmt", GEMM_FORMATS)
@pytest.mark.parametrize("prompt", [False, True])
def test_gemm_over_several_panels_and_k_blocks(isa, rng, fmt, prompt):
    """The GEMMs (T above the GEMV's limit: decoded panels, or the integer GEMMs) on rows that
    end inside a panel / a 16- or 32-row unit and a width of several k blocks with a partial
    last one (the panel GEMM's blocks are 1024 columns); each token's result is the same
    whatever tokens share the call."""
    shape = (100, 2100)
    w, mask = random_weight(rng, shape, fmt)
    p = kernels.pack(w, fmt, mask)
    x = rng.standard_normal((45, shape[1])).astype(np.float32)
    y = kernels.linear(x, p, prompt=prompt)
    np.testing.assert_allclose(y, ref.linear_as_run(x, p, prompt), **tolerance(fmt),
                               err_msg=f"{fmt} {isa}")
    limit = min(p.native().gemv_max_tokens, 36)
    for T in (limit + 1, limit + 9):  # GEMM (or GEMV, where it serves every T) calls
        np.testing.assert_array_equal(kernels.linear(x[:T], p, prompt=prompt), y[:T],
                                      err_msg=f"{fmt} T={T} {isa}")
    np.testing.assert_array_equal(kernels.linear(x[::-1].copy(), p, prompt=prompt)[::-1], y)


def test_sparse_fp32_gemm_over_token_tiles(isa, rng):
    """From 64 tokens, bitmask fp32 on AVX-512 multiplies only the kept weights, in tiles of up
    to 128 tokens split near-equally (300: 3 of 100), rows in runs of 64: against the NumPy
    twin, and each token's result is the same whatever tokens share the call."""
    shape = (150, 700)
    w, mask = random_weight(rng, shape, "sparse_fp32")
    p = kernels.pack(w, "sparse_fp32", mask)
    x = rng.standard_normal((300, shape[1])).astype(np.float32)
    y = kernels.linear(x, p)
    np.testing.assert_allclose(y, ref.linear_as_run(x, p, False), **tolerance("sparse_fp32"))
    for T in (64, 100, 129, 256):
        np.testing.assert_array_equal(kernels.linear(x[:T], p), y[:T], err_msg=f"T={T} {isa}")
    np.testing.assert_array_equal(kernels.linear(x[::-1].copy(), p)[::-1], y)


@pytest.mark.parametrize("fmt", [f for f in GEMM_FORMATS if not parse_format(f).act_int8])
@pytest.mark.parametrize("prompt", [False, True])
def test_gemm_panels_hold_exactly_the_dequantized_weights(isa, rng, fmt, prompt):
    """One-hot tokens read the decoded panels back (a single nonzero product per output): every
    ISA's row decoder gives exactly the NumPy twin's weights. (The int8 GEMM multiplies the
    integer weights by the product of two scales, the token's 1 / 127 and the weight's: a few
    ulp from the dequantized value, where one integer off is 1 / 127 or more. q4_k's group min
    comes off the scaled dot there, s * q - m in float: a few ulp of the weights' scale.)"""
    shape = (70, 192)
    w, mask = random_weight(rng, shape, fmt)
    p = kernels.pack(w, fmt, mask)
    gemm = prompt and p.native().int8_gemm_act_group >= 0
    rtol = 1e-6 if gemm else 0
    atol = 1e-6 * np.abs(w).max() if gemm and p.spec.layout.superblock else 0
    eye = np.eye(shape[1], dtype=np.float32)
    np.testing.assert_allclose(kernels.linear(eye, p, prompt=prompt).T, ref.dequantize(p),
                               rtol=rtol, atol=atol, err_msg=f"{fmt} {isa}")


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "int8", "int8_a8", "int4_g32_asym_a8",
                                 "sparse_fp32", "sparse_int8_a8", "sparse_int4_g64", "2:4_int8_a8"])
def test_multithreaded_rows_and_panels(isa, rng, fmt):
    # Large enough that GEMV and GEMM run in parallel regions (small ones stay serial).
    shape = (515, 256)
    w, mask = random_weight(rng, shape, fmt)
    p = kernels.pack(w, fmt, mask)
    saved = kernels.get_num_threads()
    try:
        kernels.set_num_threads(2)
        for T in (1, 5, 20, 40, 70):
            x = rng.standard_normal((T, shape[1])).astype(np.float32)
            for prompt in (False, True):
                np.testing.assert_allclose(kernels.linear(x, p, prompt=prompt),
                                           ref.linear_as_run(x, p, prompt), **tolerance(fmt))
    finally:
        kernels.set_num_threads(saved)


@pytest.mark.parametrize("fmt", ["int8_a8", "sparse_int8", "2:4_int8", "int4_g32",
                                 "int4_g64_asym_a8", "sparse_int4_g32"])
def test_pack_quantized_keeps_exact_integers(rng, fmt):
    s = parse_format(fmt)
    out, cols = 24, 128
    if s.bits == 8:
        q = rng.integers(-127, 128, (out, cols))
        scale, zp = rng.random(out).astype(np.float32), None
    else:
        lo, hi = (0, 16) if s.asym else (-8, 8)
        q = rng.integers(lo, hi, (out, cols))
        scale = rng.random((out, cols // s.group)).astype(np.float32)
        zp = rng.integers(0, 16, scale.shape) if s.asym else None
    mask = None
    if s.sparsity is Sparsity.BITMASK:
        mask = rng.random(q.shape) < 0.5
    elif s.sparsity is Sparsity.TWO_FOUR:
        _, mask = random_weight(rng, (out, cols), fmt)
    p = kernels.pack_quantized(q, scale, fmt, zero_point=zp, mask=mask)
    G = s.group or cols
    z = 0 if zp is None else np.repeat(zp, G, axis=1)
    want = (q - z) * np.repeat(scale.reshape(out, -1), G, axis=1)
    if mask is not None:
        want = want * mask
    np.testing.assert_allclose(ref.dequantize(p), want, rtol=1e-6)
