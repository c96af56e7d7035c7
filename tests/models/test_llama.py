"""The Llama-family forward against transformers: logits of tiny random Llama / Mistral / Qwen2
checkpoints (every config feature we claim), and of SmolLM2-135M loaded from its GGUF."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sparsellm.engine import Engine
from sparsellm.models import load_checkpoint
from sparsellm.models.decoder import ModelArgs, attention
from sparsellm.models.llama import model_args, unpermute_gguf_qk
from sparsellm.models.rope import rope_inv_freq

TOL = 1e-3

FP32_VARIANTS = ["llama", "llama_tied", "llama_attn_bias", "llama_head_dim", "llama3_rope",
                 "llama32", "llama_linear_rope", "llama_sharded", "mistral", "qwen2", "qwen2_tied",
                 "qwen2_5", "qwen2_swa"]


def our_logits(folder_or_checkpoint, ids: list[int], chunk: int = 64,
               weights: str | None = None) -> np.ndarray:
    engine = Engine(folder_or_checkpoint, sequence_length=len(ids) + 1,
                    prompt_processing_sequence_length=chunk, weights=weights)
    return engine.prefill(engine.add_sequence(), ids, all_logits=True)


@pytest.mark.parametrize("variant", [*FP32_VARIANTS, "llama_bf16"])
def test_logits_match_transformers(variant, tiny_model_dir, hf_model, hf_logits_fn, token_ids):
    """All positions of a 100-token sequence (longer than the rope/sliding-window scales)."""
    folder = tiny_model_dir(variant)
    ids = token_ids(100, seed=1)
    ref = hf_logits_fn(hf_model(folder), ids)  # bf16 weights are upcast exactly to fp32 by both
    ours = our_logits(folder, ids, chunk=32)
    assert ours.shape == ref.shape == (100, hf_model(folder).config.vocab_size)
    assert np.abs(ref).max() > 1.0, "logits too small for the comparison to mean anything"
    np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0)


def test_variants_really_differ(tiny_model_dir, hf_model, hf_logits_fn, token_ids):
    """Guard against a vacuous comparison: rope scaling and the sliding window change logits far
    beyond the tolerance, so ignoring them would fail test_logits_match_transformers."""
    ids = token_ids(100, seed=1)
    base = load_checkpoint(tiny_model_dir("llama"))
    for variant in ["llama3_rope", "llama_linear_rope"]:
        ck = load_checkpoint(tiny_model_dir(variant))
        ck = ck.with_tensors(base.tensors)  # same weights, only the rope differs
        plain = dict(ck.config, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                     rope_scaling=None, rope_theta=1e4)
        scaled = our_logits(ck, ids)
        ck.config = plain
        unscaled = our_logits(ck, ids)
        assert np.abs(scaled - unscaled).max() > 100 * TOL, variant
    mistral = load_checkpoint(tiny_model_dir("mistral"))
    windowed = our_logits(mistral, ids)
    mistral.config = dict(mistral.config, sliding_window=None)
    full = our_logits(mistral, ids)
    np.testing.assert_allclose(windowed[:8], full[:8], atol=TOL)  # inside the window: identical
    assert np.abs(windowed[8:] - full[8:]).max() > 100 * TOL


def test_transformers_v4_style_config(tiny_model_dir, hf_model, hf_logits_fn, token_ids, tmp_path):
    """Checkpoints saved by transformers 4.x spell rope settings `rope_theta` / `rope_scaling`."""
    import json
    import shutil

    src = tiny_model_dir("llama3_rope")
    folder = tmp_path / "v4"
    shutil.copytree(src, folder)
    config = json.loads((folder / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    (folder / "config.json").write_text(json.dumps(config))
    ids = token_ids(90, seed=3)
    np.testing.assert_allclose(our_logits(folder, ids), hf_logits_fn(hf_model(src), ids),
                               atol=TOL, rtol=0)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_matches_one_shot(chunk, tiny_model_dir, token_ids):
    folder = tiny_model_dir("mistral")  # the sliding window must hold across chunk boundaries
    ids = token_ids(50, seed=2)
    np.testing.assert_allclose(our_logits(folder, ids, chunk=chunk),
                               our_logits(folder, ids, chunk=50), atol=1e-4, rtol=0)


def test_rope_inv_freq_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cases = [
        ("linear", {"rope_type": "linear", "factor": 4.0}),
        ("llama3", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    ]
    for kind, scaling in cases:
        config = LlamaConfig(hidden_size=2048, num_attention_heads=32, rope_theta=500000.0,
                             rope_scaling=dict(scaling), max_position_embeddings=131072)
        ref, _ = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
        ours = rope_inv_freq(64, 500000.0, scaling)
        np.testing.assert_allclose(ours, ref.double().numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="unsupported rope_scaling type 'yarn'"):
        rope_inv_freq(64, 1e4, {"rope_type": "yarn", "factor": 2.0})


def test_unpermute_inverts_llama_cpp_permute():
    """llama.cpp's convert_hf_to_gguf.py permutes Q/K rows; we must undo exactly that."""
    from gguf.constants import GGMLQuantizationType  # noqa: F401  (gguf importable)

    def llama_cpp_permute(w, n_head):  # verbatim from convert_hf_to_gguf.LlamaModel.permute
        return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
                .swapaxes(1, 2).reshape(w.shape))

    w = np.random.default_rng(0).standard_normal((64, 24)).astype(np.float32)
    for heads in (1, 2, 4):
        np.testing.assert_array_equal(unpermute_gguf_qk(llama_cpp_permute(w, heads), heads), w)
    b = np.arange(32, dtype=np.float32)  # 1-D (biases)
    np.testing.assert_array_equal(unpermute_gguf_qk(llama_cpp_permute(b, 4), 4), b)


def test_attention_matches_torch_sdpa():
    rng = np.random.default_rng(0)
    n, H, KV, L, hd = 5, 4, 2, 9, 8
    q = rng.standard_normal((n, H, hd)).astype(np.float32)
    k = rng.standard_normal((KV, L, hd)).astype(np.float32)
    v = rng.standard_normal((KV, L, hd)).astype(np.float32)
    positions = np.arange(L - n, L)
    for window in (None, 3):
        out = attention(q, k, v, positions, 1 / np.sqrt(hd), window)
        qi = positions[:, None]
        kj = np.arange(L)[None, :]
        allowed = kj <= qi
        if window:
            allowed &= kj > qi - window
        ref = torch.nn.functional.scaled_dot_product_attention(
            torch.from_numpy(q).transpose(0, 1),  # (H, n, hd)
            torch.from_numpy(k).repeat_interleave(H // KV, 0),
            torch.from_numpy(v).repeat_interleave(H // KV, 0),
            attn_mask=torch.from_numpy(allowed),
        ).transpose(0, 1).numpy()
        np.testing.assert_allclose(out, ref, atol=1e-5)


def test_model_args_from_config_ignores_unknown_keys_and_validates_heads():
    args = model_args({"hidden_size": 64, "intermediate_size": 128,
                                  "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "vocab_size": 10, "some_future_key": 1})
    assert args.num_key_value_heads == 4 and args.head_dim == 16
    with pytest.raises(ValueError, match="num_attention_heads .4. must be a multiple of "
                                         "num_key_value_heads .3."):
        ModelArgs(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=3, vocab_size=10)


# ---- SmolLM2-135M from the shipped GGUF --------------------------------------------------------
@pytest.mark.slow
def test_smollm2_gguf_logits_match_transformers(smollm2_checkpoint, smollm2_hf_model,
                                                smollm2_hf_tokenizer):
    text = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:"
    ids = smollm2_hf_tokenizer(text)["input_ids"]
    assert smollm2_checkpoint.tokenizer.encode(text) == ids
    with torch.no_grad():
        ref = smollm2_hf_model(torch.tensor([ids])).logits[0].numpy()
    # fp32: the file's exact values, as transformers dequantizes them
    ours = our_logits(smollm2_checkpoint, ids, chunk=16, weights="fp32")
    assert np.abs(ref).max() > 5
    np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0)
    # By default the Q4_1 tensors run as int8 per output channel (gguf_formats.py): within
    # the requantization's error of the same logits, and the same next token nearly always.
    default = our_logits(smollm2_checkpoint, ids, chunk=16)
    rms = np.sqrt(np.mean((default - ref) ** 2) / np.mean(ref ** 2))
    assert 1e-3 < rms < 0.05, rms  # measured: 0.033 (max |error| 2.3 of max |logit| 42)
    assert np.mean(default.argmax(-1) == ref.argmax(-1)) >= 0.9
