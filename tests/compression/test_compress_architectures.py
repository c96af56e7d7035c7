"""SparseGPT 50% + int8 (the seed recipe) on a tiny model of every non-Llama architecture: the
calibration runs the decoder's own layer math, the compressed folder loads back (canonical
tensor names + marker), runs natively in its declared formats exactly like the NumPy reference,
and generates."""

from __future__ import annotations

import json

import numpy as np
import pytest

from arch_variants import ARCH_VARIANTS
from sparsellm import Pipeline, compress, load_checkpoint
from sparsellm.engine import Engine
from sparsellm.models.checkpoint import TENSOR_NAMES_KEY


@pytest.mark.parametrize("variant", ARCH_VARIANTS)
def test_sparsegpt_int8_compress_load_generate(variant, tiny_model_dir, calib_texts, tmp_path,
                                               seed_recipe, greedy_tokens):
    src = load_checkpoint(tiny_model_dir(variant))
    out = tmp_path / variant
    result = compress(src, calib_texts, seed_recipe, out, num_calibration_samples=4,
                      max_seq_length=32, progress=False)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == src.config["architectures"]
    # the marker where the HF names differ from the canonical ones; Qwen3's are the canonical
    # ones (Architecture.canonical_hf_names), so its folder is a plain compressed-tensors one
    assert config.get(TENSOR_NAMES_KEY) == (
        None if src.architecture.canonical_hf_names else "canonical")

    ckpt = load_checkpoint(out)
    assert ckpt.architecture.name == src.architecture.name
    linears = [n for n in ckpt.linear_weight_names if n.startswith("model.layers.")]
    assert len(linears) == len([s for s in result.report["tensors"]
                                if s["name"].startswith("model.layers.")])
    for name in linears:  # attention and MLP linears of every layer: 50% sparse int8
        assert ckpt.weight_formats[name].name == "sparse_int8_a8", name
        assert (ckpt.tensors[name] == 0).mean() >= 0.5, name
    for name in ("model.layers.0.mlp.up_proj.bias", "model.norm.weight"):
        if name in src.tensors:  # non-linear tensors pass through unchanged
            np.testing.assert_array_equal(ckpt.tensors[name], src.tensors[name])

    ids = ckpt.tokenizer.encode("def add(a, b):\n    return")
    native = Engine(ckpt, sequence_length=64, max_sequences=2)
    numpy_ = Engine(ckpt, sequence_length=64, backend="numpy")
    a = native.prefill(native.add_sequence(), ids, all_logits=True)
    b = numpy_.prefill(numpy_.add_sequence(), ids, all_logits=True)
    # int8 activations on compressed-tensors' grid: up to ~7% of the logit range at a token of
    # the tiny phi3 (a wrong weight or layout is ~100%)
    np.testing.assert_allclose(a, b, atol=0.1 * np.abs(b).max(), rtol=0)

    pipe = Pipeline.create(model_path=str(out), sequence_length=128, max_generated_tokens=8,
                           batch_size=1)
    gen = pipe("def add(", force_max_tokens=True).generations[0]
    assert gen.token_ids == greedy_tokens(native, pipe.tokenizer.encode("def add("), 8)


def test_compress_gguf_source_of_another_architecture(tiny_arch_gguf, calib_texts, tmp_path,
                                                      seed_recipe):
    """A Phi-3 GGUF (fused qkv / gate_up in llama.cpp's layout) compresses and loads back."""
    path, _ = tiny_arch_gguf("phi3")
    out = tmp_path / "phi3"
    compress(str(path), calib_texts, seed_recipe, out, num_calibration_samples=2,
             max_seq_length=32, progress=False)
    ckpt = load_checkpoint(out)
    assert ckpt.architecture.name == "phi3" and ckpt.format == "safetensors"
    assert ckpt.weight_formats["model.layers.1.mlp.gate_proj.weight"].name == "sparse_int8_a8"
    engine = Engine(ckpt, sequence_length=32)
    logits = engine.prefill(engine.add_sequence(), [5, 6, 7])
    assert np.isfinite(logits).all()
