"""Every quantized GGUF type sparsellm runs (issue 26 item 3), against the `gguf` package's own
dequantization (the reference llama.cpp's Python tools use): the values loaded from a file equal
gguf's, and each tensor runs in the native format gguf_formats.py declares for its type: Q4_0
exactly as int4_g32 and Q4_K exactly as q4_k (their integers kept), every other type as int8 per
output channel within half a step of each row's values. K-quant blocks are random bytes with
sane scales (gguf can only dequantize them); the other types are quantized by gguf from random
weights."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from sparsellm.engine import Engine
from sparsellm.kernels.reference import dequantize
from sparsellm.models import load_checkpoint
from sparsellm.models.gguf_formats import DECLARED, EXACT, q4_0_integers, q4_k_integers

HIDDEN = 256  # K-quant blocks hold 256 weights
# Byte offsets of the fp16 super-block scales (d, and dmin where the type has one), from
# gguf-py's quants.py / ggml's block structs: random bytes elsewhere are valid blocks.
K_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
TENSORS = {"token_embd.weight": "model.embed_tokens.weight",
           "output.weight": "lm_head.weight",
           "blk.0.attn_v.weight": "model.layers.0.self_attn.v_proj.weight",
           "blk.0.attn_output.weight": "model.layers.0.self_attn.o_proj.weight",
           "blk.0.ffn_gate.weight": "model.layers.0.mlp.gate_proj.weight",
           "blk.0.ffn_up.weight": "model.layers.0.mlp.up_proj.weight",
           "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
           "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight",
           "blk.0.attn_k.weight": "model.layers.0.self_attn.k_proj.weight"}


def blocks(qtype: str, rows: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, bytes per row) of `qtype` blocks for a (rows, HIDDEN) weight."""
    kind = getattr(gguf.GGMLQuantizationType, qtype)
    if qtype not in K_SCALES:
        return gguf.quants.quantize(rng.standard_normal((rows, HIDDEN)).astype(np.float32)
                                    * 0.05, kind)
    block, size = gguf.GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (rows, HIDDEN // block, size), dtype=np.uint8)
    for off, value in zip(K_SCALES[qtype], (0.002, 0.001), strict=False):
        raw[..., off:off + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return raw.reshape(rows, -1)


@pytest.fixture(scope="module")
def quant_files(tmp_path_factory, spm_gguf):
    """qtype -> (path of a one-layer Llama GGUF whose 2-D weights are all `qtype`, {canonical
    name: the block bytes written})."""
    (tokens, _, _), add_vocab, finish = spm_gguf
    built = {}

    def get(qtype: str):
        if qtype in built:
            return built[qtype]
        path = tmp_path_factory.mktemp(f"gguf_{qtype}") / f"one-layer-{qtype}.gguf"
        rng = np.random.default_rng(sum(map(ord, qtype)))
        w = gguf.GGUFWriter(str(path), "llama")
        for add, value in ((w.add_block_count, 1), (w.add_context_length, 64),
                           (w.add_embedding_length, HIDDEN), (w.add_feed_forward_length, HIDDEN),
                           (w.add_head_count, 4), (w.add_head_count_kv, 4),
                           (w.add_layer_norm_rms_eps, 1e-5), (w.add_rope_freq_base, 1e4),
                           (w.add_rope_dimension_count, HIDDEN // 4),
                           (w.add_vocab_size, len(tokens))):
            add(value)
        add_vocab(w)
        written = {}
        for gname, name in TENSORS.items():
            rows = len(tokens) if gname in ("token_embd.weight", "output.weight") else HIDDEN
            written[name] = blocks(qtype, rows, rng)
            w.add_tensor(gname, written[name], raw_dtype=getattr(gguf.GGMLQuantizationType,
                                                                 qtype))
        for gname in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
            w.add_tensor(gname, (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        finish(w)
        built[qtype] = path, written
        return built[qtype]

    return get


@pytest.mark.parametrize("qtype", sorted(DECLARED))
def test_values_equal_gguf_dequantization(qtype, quant_files):
    """What the checkpoint reads equals gguf's dequantization of the bytes written (q and k are
    compared after llama.cpp's row permutation is undone, like every Llama GGUF)."""
    path, written = quant_files(qtype)
    ck = load_checkpoint(path)
    kind = getattr(gguf.GGMLQuantizationType, qtype)
    for name, raw in written.items():
        ref = gguf.quants.dequantize(raw, kind).reshape(raw.shape[0], HIDDEN)
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            continue  # permuted: checked through the native packing below
        assert np.abs(ref).max() > 0, name
        np.testing.assert_array_equal(ck.tensors[name], ref, err_msg=f"{qtype} {name}")


@pytest.mark.parametrize("qtype", sorted(DECLARED))
def test_each_type_runs_in_its_declared_format(qtype, quant_files):
    path, _ = quant_files(qtype)
    ck = load_checkpoint(path)
    engine = Engine(ck, sequence_length=16, dynamic_int8=False)  # fp32 activations, as the
    expected = DECLARED[qtype].name                                 # reference below
    assert set(engine.formats.values()) == {expected}
    for name in engine.formats:
        ours = dequantize(engine.model.packed[name])[:, :HIDDEN]
        ref = ck.tensors[name]
        if qtype in EXACT:  # the file's integers and scales, kept
            np.testing.assert_array_equal(ours, ref, err_msg=name)
        else:  # int8 per output channel: within half a step of each row's largest value
            step = np.abs(ref).max(axis=1, keepdims=True) / 127
            assert np.all(np.abs(ours - ref) <= 0.5 * step * (1 + 1e-5) + 1e-12), name
    # the same model on the NumPy reference (the same packed values) gives the same logits
    ids = ck.tokenizer.encode("def add(a, b):")
    ref_engine = Engine(ck, sequence_length=16, backend="numpy")
    np.testing.assert_allclose(
        engine.prefill(engine.add_sequence(), ids, all_logits=True),
        ref_engine.prefill(ref_engine.add_sequence(), ids, all_logits=True), atol=2e-3)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0"])
def test_an_untied_quantized_embedding_stays_quantized(qtype, quant_files):
    """Token lookups decode rows of the table in its declared format (Q4_K: its exact
    integers; Q8_0: int8 per row), not of an fp32 copy of it."""
    path, written = quant_files(qtype)
    ck = load_checkpoint(path)
    embed = Engine(ck, sequence_length=16).model.embed
    assert embed.format == DECLARED[qtype].name
    ref = ck.tensors["model.embed_tokens.weight"]
    if qtype in EXACT:
        np.testing.assert_array_equal(dequantize(embed)[:, :HIDDEN], ref)
    else:
        step = np.abs(ref).max(axis=1, keepdims=True) / 127
        assert np.all(np.abs(dequantize(embed)[:, :HIDDEN] - ref) <= 0.5 * step * (1 + 1e-5))


def test_q4_0_integers_are_exact():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 96)).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)
    qt = q4_0_integers(raw, (8, 96))
    assert qt.q.min() >= -8 and qt.q.max() <= 7 and qt.scale.shape == (8, 3)
    np.testing.assert_array_equal(qt.dequantize(),
                                  gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0))


def test_q4_k_integers_are_exact():
    """Every 6-bit code position (groups 0..3 and 4..7 are packed differently) and both nibble
    halves: random blocks, two superblocks per row."""
    rng = np.random.default_rng(0)
    raw = blocks("Q4_K", 8, rng).reshape(8, 1, -1).repeat(2, axis=1).reshape(8, -1)
    raw[:, 144 + 4:] = rng.integers(0, 256, (8, 140), dtype=np.uint8)  # the second differs
    qt = q4_k_integers(raw, (8, 512))
    assert qt.q.max() <= 15 and qt.zero_point.shape == (8, 2, 16) and qt.zero_point.max() <= 63
    assert len(np.unique(qt.zero_point)) > 32  # the codes vary
    np.testing.assert_array_equal(qt.dequantize(),
                                  gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K))


def test_unsupported_type_is_refused_by_name(tmp_path, spm_gguf):
    (tokens, _, _), add_vocab, finish = spm_gguf
    path = tmp_path / "iq.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(HIDDEN)
    w.add_head_count(4)
    add_vocab(w)
    kind = gguf.GGMLQuantizationType.TQ2_0
    w.add_tensor("token_embd.weight", gguf.quants.quantize(
        np.zeros((len(tokens), HIDDEN), np.float32), kind), raw_dtype=kind)
    finish(w)
    with pytest.raises(ValueError, match=r"token_embd.weight' is stored as TQ2_0.*supported "
                                         r"GGUF types: F32, F16, BF16, Q4_0"):
        load_checkpoint(path)
