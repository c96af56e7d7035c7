"""NativeDecoderModel.forward == DecoderModel.forward (NumPy) on tiny random models of every
decoder spec (Llama; LayerNorm + parallel residual + plain GELU MLP; learned positions; ...)."""

import numpy as np
import pytest

from sparsellm.engine.native_model import NativeDecoderModel
from sparsellm.kernels.formats import parse_format
from sparsellm.kernels.layouts import Sparsity
from sparsellm.models.decoder import (
    DecoderModel,
    ModelArgs,
    layer_weight_names,
    linear_weight_names,
)

CONFIG = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=128, norm_eps=1e-5, rope_theta=10000.0)
SLOTS, CAPACITY = 3, 40
ALL_BIASES = dict(qkv_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=True)
# decoder specs of the supported architectures (see sparsellm/models/architectures.py)
SPECS = {
    "llama": {},
    "gptj": dict(norm="layer", residual="parallel", mlp="plain", activation="gelu_tanh",
                 rotary_dim=8, mlp_bias=True, lm_head_bias=True),
    "gpt_neox": dict(norm="layer", residual="parallel_two_norms", mlp="plain",
                     activation="gelu", rotary_dim=4, num_key_value_heads=4, **ALL_BIASES),
    "gpt2_opt": dict(norm="layer", rotary_dim=0, learned_positions=True, mlp="plain",
                     activation="relu", tie_word_embeddings=True, **ALL_BIASES),
    "gated_gelu": dict(activation="gelu_tanh", rotary_dim=12, mlp_bias=True),
}


def tiny_model(rng, **overrides):
    args = ModelArgs(**{**CONFIG, **overrides})
    D = args.hidden_size
    t = {"model.embed_tokens.weight": rng.standard_normal((args.vocab_size, D)),
         "model.norm.weight": 1 + 0.1 * rng.standard_normal(D)}
    if args.norm == "layer":
        t["model.norm.bias"] = 0.1 * rng.standard_normal(D)
    if args.learned_positions:
        t["model.embed_positions.weight"] = rng.standard_normal((CAPACITY, D))
    for i in range(args.num_hidden_layers):
        for name in layer_weight_names(args, i):
            if "layernorm" in name:
                t[name] = (1 if name.endswith("weight") else 0) + 0.1 * rng.standard_normal(D)
            elif name.endswith("weight"):
                rows, cols = _rows(args, name), _cols(args, name)
                t[name] = rng.standard_normal((rows, cols)) / np.sqrt(cols)
        for name in layer_weight_names(args, i):
            if name.endswith("bias") and "layernorm" not in name:
                t[name] = 0.1 * rng.standard_normal(t[name[:-4] + "weight"].shape[0])
    if not args.tie_word_embeddings:
        t["lm_head.weight"] = rng.standard_normal((args.vocab_size, D)) / 8
    if args.lm_head_bias:
        t["lm_head.bias"] = 0.1 * rng.standard_normal(args.vocab_size)
    return args, {k: v.astype(np.float32) for k, v in t.items()}


def _rows(a, name):
    if "q_proj" in name:
        return a.num_attention_heads * a.head_dim
    if "k_proj" in name or "v_proj" in name:
        return a.num_key_value_heads * a.head_dim
    if "o_proj" in name or "down_proj" in name:
        return a.hidden_size
    return a.intermediate_size


def _cols(a, name):
    if "o_proj" in name:
        return a.num_attention_heads * a.head_dim
    return a.intermediate_size if "down_proj" in name else a.hidden_size


def masks_for(args, tensors, fmt, rng):
    sparsity = parse_format(fmt).sparsity
    out = {}
    for name in linear_weight_names(args):
        w = tensors.get(name, tensors["model.embed_tokens.weight"])
        if sparsity == Sparsity.TWO_FOUR:
            keep = np.argsort(np.abs(w).reshape(w.shape[0], -1, 4), axis=2)[:, :, 2:]
            m = np.zeros((w.shape[0], w.shape[1] // 4, 4), bool)
            np.put_along_axis(m, keep, True, axis=2)
            out[name] = m.reshape(w.shape)
        elif sparsity == Sparsity.BITMASK:
            out[name] = rng.random(w.shape) < 0.5
    return out


def empty_cache(args):
    shape = (args.num_hidden_layers, SLOTS, args.num_key_value_heads, CAPACITY, args.head_dim)
    return np.zeros(shape, np.float32), np.zeros(shape, np.float32)


def run_schedule(model, args):
    """Prefill two sequences in chunks (one chunk mixes both), then batched decodes of
    different lengths; returns all logits in order and the final caches. Weight-only formats
    run on fp32 activations, as the reference does (dense int4's per-group int8 ones,
    dynamic_int8, are checked against their twin in tests/kernels and tests/engine)."""
    k, v = empty_cache(args)
    rng = np.random.default_rng(1)
    steps = [
        # (slots, positions): slot 0 prefills 7 tokens, slot 2 prefills 5 in the same batch
        ([0] * 7 + [2] * 5, list(range(7)) + list(range(5))),
        ([0] * 4, list(range(7, 11))),           # second prefill chunk of slot 0
        ([1] * 3, [0, 1, 2]),                    # slot 1 joins
        ([0, 1, 2], [11, 3, 5]),                 # batched decode, three lengths
        ([2, 0], [6, 12]),
        ([1], [4]),                              # single-token decode (GEMV path)
        ([1], [5]),
    ]
    logits = []
    for slots, positions in steps:
        slots, positions = np.array(slots), np.array(positions)
        tokens = rng.integers(0, args.vocab_size, slots.size)
        last = np.flatnonzero(np.append(np.diff(slots) != 0, True))  # last token of each run
        rows = np.concatenate([[0], last])  # plus one extra row to check row selection
        logits.append(model.forward(tokens, slots, positions, k, v, rows, dynamic_int8=False))
    return logits, k, v


FORMATS = ["fp32", "fp16", "bf16", "int8", "int8_a8", "int4_g32", "int4_g64_asym",
           "int4_g32_a8", "sparse_fp32", "sparse_int8", "sparse_int8_a8", "sparse_int4_g32",
           "sparse_int4_g64_a8", "2:4_int8", "2:4_int8_a8"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_native_forward_matches_numpy_model(isa, fmt):
    rng = np.random.default_rng(0)
    args, tensors = tiny_model(rng)
    native = NativeDecoderModel(args, tensors, fmt, masks=masks_for(args, tensors, fmt, rng),
                              max_tokens=16)
    ref = DecoderModel(args, native.dequantized_tensors())
    got, gk, gv = run_schedule(native, args)
    want, wk, wv = run_schedule(ref, args)
    # int8 activations are a (small) deviation from the fp32-activation reference model
    tol = 0.05 if parse_format(fmt).act_int8 else 2e-4
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=tol * np.abs(w).max(), rtol=0)
    np.testing.assert_allclose(gk, wk, atol=1e-4 if tol < 0.01 else 0.1)
    np.testing.assert_allclose(gv, wv, atol=1e-4 if tol < 0.01 else 0.1)


def test_mixed_formats_biases_tied_head_and_chunking(isa):
    rng = np.random.default_rng(3)
    args, tensors = tiny_model(rng, qkv_bias=True, o_bias=True, tie_word_embeddings=True)
    names = linear_weight_names(args)
    formats = dict(zip(names, ["int8", "sparse_fp32", "int4_g32", "bf16", "fp32", "fp16",
                               "sparse_int4_g32"] * 3, strict=False))
    masks = {n: rng.random(tensors[n].shape) < 0.6 for n in names
             if formats.get(n, "").startswith("sparse")}
    native = NativeDecoderModel(args, tensors, formats, masks=masks, max_tokens=5)  # chunks
    ref = DecoderModel(args, native.dequantized_tensors())
    got, _, _ = run_schedule(native, args)
    want, _, _ = run_schedule(ref, args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=2e-4 * np.abs(w).max(), rtol=0)


def test_fused_projections_of_mixed_formats_share_one_prompt_quantization(isa):
    """q/k/v and gate/up of different int8-activation formats (int4 of two group sizes, int8,
    bitmask int8) quantize a prompt chunk once for all of them (linear_multi) and each integer
    GEMM finds what it reads there: the AVX2 int4 kernel its code sums, the int16 one its
    widened codes. Against the dequantized weights, to int8 activation rounding."""
    rng = np.random.default_rng(8)
    args, tensors = tiny_model(rng)
    names = linear_weight_names(args)
    cycle = ["int4_g32_a8", "int8_a8", "int4_g64_asym_a8", "sparse_int8_a8"]
    formats = {n: cycle[i % len(cycle)] for i, n in enumerate(names)}
    masks = {n: rng.random(tensors[n].shape) < 0.5 for n in names
             if formats[n].startswith("sparse")}
    native = NativeDecoderModel(args, tensors, formats, masks=masks, max_tokens=32)
    tokens, n = rng.integers(0, args.vocab_size, 24), 24  # above every GEMV's limit
    outs = []
    for model in (native, DecoderModel(args, native.dequantized_tensors())):
        k, v = empty_cache(args)
        outs.append(model.forward(tokens, np.zeros(n, int), np.arange(n), k, v, np.arange(n)))
    np.testing.assert_allclose(outs[0], outs[1], atol=0.05 * np.abs(outs[1]).max(), rtol=0)


@pytest.mark.parametrize("fmt", ["fp32", "int4_g32_a8"])
def test_a_step_longer_than_max_tokens_runs_in_even_chunks(isa, fmt):
    """A step of 19 tokens with max_tokens 16 runs as 10 + 9, not 16 + 3: three tokens alone
    would take the GEMV path, whose last bits differ from the GEMM's, and a sequence's logits
    would depend on what shared its step. Both chunks take the GEMM, as the sequence's 12 tokens
    do in a step of their own: the same bits."""
    rng = np.random.default_rng(5)
    args, tensors = tiny_model(rng)
    model = NativeDecoderModel(args, tensors, fmt, max_tokens=16)
    first, second = rng.integers(0, args.vocab_size, 7), rng.integers(0, args.vocab_size, 12)
    k, v = empty_cache(args)
    both = model.forward(np.concatenate([first, second]), [0] * 7 + [1] * 12,
                         list(range(7)) + list(range(12)), k, v, np.arange(19))
    k, v = empty_cache(args)
    alone = model.forward(second, [1] * 12, list(range(12)), k, v, np.arange(12))
    np.testing.assert_array_equal(both[7:], alone)


def test_packed_weights_share_one_block_except_fp32_ones_used_in_place():
    rng = np.random.default_rng(4)
    args, tensors = tiny_model(rng, tie_word_embeddings=True)
    names = linear_weight_names(args)
    formats = dict(zip(names[:-1], ["int8_a8", "fp32", "sparse_int4_g32"] * 5, strict=False))
    masks = {n: tensors[n] != 0 for n in names if formats.get(n, "").startswith("sparse")}
    native = NativeDecoderModel(args, tensors, formats, masks=masks)

    def bottom(a):  # the buffer at the bottom of a view chain
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a if a.base is None else a.base

    in_place, blocks = [], set()
    for n in names:
        p = native.packed[n]
        source = tensors.get(n, tensors["model.embed_tokens.weight"])
        if np.shares_memory(p.arrays["data"], source):  # fp32, no padding: a copy would double it
            in_place.append(n)
        else:
            blocks |= {id(bottom(a)) for a in p.arrays.values()}
    assert len(blocks) == 1
    assert in_place and all(formats.get(n, "fp32") == "fp32" for n in in_place)


@pytest.mark.parametrize("fmt", ["fp32", "int8_a8", "sparse_int8", "int4_g32"])
@pytest.mark.parametrize("spec", [s for s in SPECS if s != "llama"])
def test_every_decoder_spec_matches_numpy_model(isa, spec, fmt):
    rng = np.random.default_rng(7)
    args, tensors = tiny_model(rng, **SPECS[spec])
    native = NativeDecoderModel(args, tensors, fmt, masks=masks_for(args, tensors, fmt, rng),
                                max_tokens=16)
    got, gk, _ = run_schedule(native, args)
    want, wk, _ = run_schedule(DecoderModel(args, native.dequantized_tensors()), args)
    tol = 0.05 if parse_format(fmt).act_int8 else 2e-4
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=tol * np.abs(w).max(), rtol=0)
    np.testing.assert_allclose(gk, wk, atol=1e-4 if tol < 0.01 else 0.1)


def test_learned_positions_beyond_the_table_raise():
    rng = np.random.default_rng(8)
    args, tensors = tiny_model(rng, **SPECS["gpt2_opt"])
    tensors["model.embed_positions.weight"] = tensors["model.embed_positions.weight"][:10]
    model = NativeDecoderModel(args, tensors, "fp32", max_tokens=8)
    k, v = empty_cache(args)
    one = np.array([0])
    with pytest.raises(IndexError, match="beyond the 10 learned positions"):
        model.forward(one, one, np.array([10]), k, v, one)


def test_sliding_window_matches(isa):
    rng = np.random.default_rng(4)
    args, tensors = tiny_model(rng, sliding_window=4)
    native = NativeDecoderModel(args, tensors, "fp32", max_tokens=16)
    got, _, _ = run_schedule(native, args)
    want, _, _ = run_schedule(DecoderModel(args, tensors), args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=2e-4 * np.abs(w).max(), rtol=0)


def test_bad_calls_raise():
    rng = np.random.default_rng(5)
    args, tensors = tiny_model(rng)
    model = NativeDecoderModel(args, tensors, "fp32", max_tokens=8)
    k, v = empty_cache(args)
    one = np.array([0])
    with pytest.raises(IndexError, match="beyond the cache"):
        model.forward(one, one, np.array([CAPACITY]), k, v, one)
    with pytest.raises(IndexError, match="vocab"):
        model.forward(np.array([args.vocab_size]), one, one, k, v, one)
    with pytest.raises(ValueError, match="unknown weights"):
        NativeDecoderModel(args, tensors, {"model.layers.9.mlp.up_proj.weight": "int8"})


def test_config_crosses_as_the_typed_struct():
    """The spec reaches C++ as _native.ModelConfig, its vocabulary named as ModelArgs spells it;
    make_model refuses a config that disagrees with its weights."""
    from sparsellm.functional import ACTIVATIONS
    from sparsellm.kernels._ext import native
    from sparsellm.models.decoder import RESIDUALS

    assert list(native().Activation.__members__) == list(ACTIVATIONS)
    assert list(native().Residual.__members__) == list(RESIDUALS)
    rng = np.random.default_rng(6)
    args, tensors = tiny_model(rng, **SPECS["gpt_neox"])
    model = NativeDecoderModel(args, tensors, "fp32", max_tokens=8)
    config = model._model.config
    assert (config.layers, config.heads, config.rotary_dim, config.max_tokens) == (2, 4, 4, 8)
    assert config.residual == native().Residual.parallel_two_norms
    assert config.act == native().Activation.gelu and not config.gated and config.layer_norm
    assert len(config.inv_freq) == 2
    config.layers = 3
    with pytest.raises(ValueError, match="number of layers given"):
        native().NativeModel(config, [], None, None, np.ones(64, np.float32), None, None, None)
    with pytest.raises(TypeError):
        config.act = "gelu"  # only the enum


def test_layer_weights_cross_as_the_one_declared_struct():
    """model.h declares a layer's tensors once (SL_LAYER_MATRICES / SL_LAYER_VECTORS): the
    Python twin has exactly those fields, the wrapper maps every one of them to a canonical
    tensor, a misspelt field is an error (a dict key would be ignored), and a missing required
    matrix or a gate on an ungated MLP is refused by name."""
    from sparsellm.engine.native_model import _LINEAR, _VECTORS
    from sparsellm.kernels._ext import native

    layer_type = native().LayerWeights
    assert sorted(_LINEAR) == sorted(layer_type.matrices)
    assert sorted(_VECTORS) == sorted(layer_type.vectors)
    layer = layer_type()
    assert layer.q is None and layer.attn_norm is None
    with pytest.raises(AttributeError):
        layer.attn_nrom = np.ones(64, np.float32)
    rng = np.random.default_rng(7)
    for spec, drop, message in [("llama", "k", "layer weight missing: k"),
                                ("gpt_neox", None, "gate .* goes with gated")]:
        args, tensors = tiny_model(rng, **SPECS[spec])
        model = NativeDecoderModel(args, tensors, "fp32", max_tokens=8)
        built = model._model  # rebuild it from its own parts, one field changed
        layers = []
        for i in range(args.num_hidden_layers):
            layer = layer_type()
            p = f"model.layers.{i}."
            for key, base in _LINEAR.items():
                if p + base + ".weight" in model.packed:
                    setattr(layer, key, model.packed[p + base + ".weight"].native())
            for key, name in _VECTORS.items():
                t = tensors.get(p + name)
                setattr(layer, key, None if t is None else np.ascontiguousarray(t, np.float32))
            if drop:
                setattr(layer, drop, None)
            else:  # an ungated MLP given a gate
                layer.gate = layer.up
            layers.append(layer)
        head = model.packed["lm_head.weight"].native()
        with pytest.raises(ValueError, match=message):
            native().NativeModel(built.config, layers, head, None,
                                 np.ones(args.hidden_size, np.float32), None, head, None)


@pytest.mark.parametrize("fmt", ["int8_a8", "sparse_int8", "int4_g64"])
def test_wider_model_on_two_threads(isa, fmt):
    # Wide enough that projections and attention run in parallel regions.
    from sparsellm import kernels

    rng = np.random.default_rng(6)
    args, tensors = tiny_model(rng, hidden_size=256, intermediate_size=512,
                               num_attention_heads=8, num_key_value_heads=2)
    saved = kernels.get_num_threads()
    kernels.set_num_threads(2)
    try:
        native = NativeDecoderModel(args, tensors, fmt, masks=masks_for(args, tensors, fmt, rng),
                                  max_tokens=16)
        got, _, _ = run_schedule(native, args)
    finally:
        kernels.set_num_threads(saved)
    want, _, _ = run_schedule(DecoderModel(args, native.dequantized_tensors()), args)
    tol = 0.05 if parse_format(fmt).act_int8 else 2e-4
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=tol * np.abs(w).max(), rtol=0)


@pytest.mark.parametrize("fmt", ["fp32", "int8_a8", "int4_g32_a8", "sparse_int8_a8",
                                 "sparse_int4_g32", "2:4_int8"])
def test_batched_and_verification_steps_equal_single_token_steps(isa, fmt):
    """Batched decode and speculative verification (several tokens of one sequence in one call)
    give bitwise the logits of one-token steps: greedy output cannot depend on batching."""
    rng = np.random.default_rng(7)
    args, tensors = tiny_model(rng)
    model = NativeDecoderModel(args, tensors, fmt, masks=masks_for(args, tensors, fmt, rng),
                               max_tokens=16)
    prompt = rng.integers(0, args.vocab_size, 6)
    more = rng.integers(0, args.vocab_size, (SLOTS, 5))

    def prefilled():
        k, v = empty_cache(args)
        for s in range(SLOTS):
            model.forward(prompt, np.full(6, s), np.arange(6), k, v, np.array([5]))
        return k, v

    # One token at a time, one sequence at a time.
    k, v = prefilled()
    single = np.stack([
        np.concatenate([model.forward(more[s, j:j + 1], np.array([s]), np.array([6 + j]), k, v,
                                      np.array([0])) for j in range(5)])
        for s in range(SLOTS)])
    # All sequences in one batched step per position.
    k, v = prefilled()
    batched = np.stack([model.forward(more[:, j], np.arange(SLOTS), np.full(SLOTS, 6 + j), k, v,
                                      np.arange(SLOTS)) for j in range(5)], axis=1)
    np.testing.assert_array_equal(batched, single)
    # Verification: the 5 tokens of each sequence in one call, every row scored.
    k, v = prefilled()
    for s in range(SLOTS):
        verify = model.forward(more[s], np.full(5, s), 6 + np.arange(5), k, v, np.arange(5))
        np.testing.assert_array_equal(verify, single[s])
