"""Qwen3, Llama 3.x and Qwen2.5 (issue 26 item 2) against transformers: tiny random models
prefill a prompt and decode with the KV cache past the llama3 RoPE scaling's
original_max_position_embeddings, on the NumPy reference and the native runtime, from their HF
folders and from GGUF files written the way llama.cpp's converter writes them (qwen3 QK-norm
tensors, llama3 scaling stored as rope_freqs.weight)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from sparsellm.engine import Engine
from sparsellm.models import load_checkpoint
from sparsellm.models.convert import UnsupportedConfigError

TOL = 1e-3  # the other families' tolerance (tests/models/test_architectures.py)
PROMPT, DECODED = 24, 60  # positions 0..83: past both tiny original contexts (32 and 64)


def prefill_and_decode(engine: Engine, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """Prefill `ids` (in the engine's prompt chunks), then n greedy decode steps through the KV
    cache -> (the decoded tokens, logits of every position: prefill rows, then one per step)."""
    seq = engine.add_sequence()
    rows = [engine.prefill(seq, ids, all_logits=True)]
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(rows[-1][-1])))
        rows.append(engine.decode_step([seq], [out[-1]]))
    engine.release(seq)
    return out, np.concatenate(rows)


def check_against(model, source, backend: str, ids: list[int], what: str) -> None:
    """Our prefill + decode logits equal transformers' over the whole sequence."""
    engine = Engine(source, sequence_length=PROMPT + DECODED + 4,
                    prompt_processing_sequence_length=8, backend=backend)
    tokens, ours = prefill_and_decode(engine, ids, DECODED)
    ref = hf_logits(model, ids + tokens)
    assert np.abs(ref).max() > 1.0, "logits too small for the comparison to mean anything"
    np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0, err_msg=f"{what}/{backend}")


def hf_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.mark.parametrize("backend", ["numpy", "native"])
@pytest.mark.parametrize("variant", ["qwen3", "llama3_rope", "llama32", "qwen2_5"])
def test_prefill_and_decode_match_transformers(variant, backend, tiny_model_dir, hf_model,
                                               token_ids):
    folder = tiny_model_dir(variant)
    check_against(hf_model(folder), folder, backend, token_ids(PROMPT, seed=6), variant)


@pytest.mark.parametrize("variant", ["qwen3", "llama3_rope", "qwen2_5"])
def test_gguf_prefill_and_decode_match_transformers(variant, tiny_arch_gguf, token_ids):
    path, model = tiny_arch_gguf(variant)
    ck = load_checkpoint(path)
    assert ck.format == "gguf"
    assert ck.architecture.name == ("qwen3" if variant == "qwen3" else "llama")
    for backend in ("numpy", "native"):
        check_against(model, ck, backend, token_ids(PROMPT, seed=7), f"{variant}/gguf")


def test_llama3_scaling_changes_the_logits(tiny_model_dir, token_ids):
    """Guard against a vacuous comparison: the same Llama 3.2-like weights without the llama3
    rule (same theta) give other logits, on both backends alike."""
    ck = load_checkpoint(tiny_model_dir("llama32"))
    rope = dict(ck.config["rope_parameters"])
    assert rope["rope_type"] == "llama3" and ck.args.vocab_size == 128256
    ids = token_ids(PROMPT + DECODED, seed=10)
    logits = {}
    for name, rope_parameters in (("llama3", rope), ("plain", {
            "rope_type": "default", "rope_theta": rope["rope_theta"]})):
        ck.config = {**ck.config, "rope_parameters": rope_parameters}
        for backend in ("numpy", "native"):
            engine = Engine(ck, sequence_length=len(ids), backend=backend)
            logits[name, backend] = engine.prefill(engine.add_sequence(), ids, all_logits=True)
    np.testing.assert_allclose(logits["plain", "native"], logits["plain", "numpy"], atol=TOL)
    assert np.abs(logits["llama3", "native"] - logits["plain", "native"]).max() > 100 * TOL


def test_gguf_llama3_scaling_comes_from_rope_freqs(tiny_arch_gguf):
    """llama.cpp stores llama3 scaling only as per-frequency divisors (no rope_scaling
    metadata): the loader must use them, and they must scale (factor 8 on the lowest
    frequencies, 1 on the highest)."""
    ck = load_checkpoint(tiny_arch_gguf("llama3_rope")[0])
    assert "rope_scaling" not in ck.config and ck.args.rope_scaling is None
    factors = ck.tensors["rope_freqs.weight"]
    assert factors[0] == 1.0 and factors[-1] == 8.0
    model = ck.build_model()
    base = 1.0 / 500000.0 ** (np.arange(0, 16, 2) / 16)
    np.testing.assert_allclose(model.inv_freq, base / factors, rtol=1e-12)


def test_qwen3_spec(tiny_model_dir):
    """QK-norm weights per head (head_dim, not hidden / heads), GQA, tied, no biases."""
    ck = load_checkpoint(tiny_model_dir("qwen3"))
    a = ck.args
    assert ck.architecture.name == "qwen3" and a.qk_norm and a.tie_word_embeddings
    assert (a.head_dim, a.hidden_size // a.num_attention_heads) == (32, 16)
    assert a.num_key_value_heads < a.num_attention_heads
    assert not (a.qkv_bias or a.o_bias) and a.sliding_window is None
    assert ck.tensors["model.layers.1.self_attn.k_norm.weight"].shape == (32,)
    assert "lm_head.weight" not in ck.tensors


def test_qwen3_qk_norm_changes_the_logits(tiny_model_dir, token_ids):
    """Guard against a vacuous comparison: other QK-norm weights give other logits, on both
    backends alike."""
    ck = load_checkpoint(tiny_model_dir("qwen3"))
    ids = token_ids(30, seed=8)
    tensors = dict(ck.tensors)
    for i in range(ck.args.num_hidden_layers):
        tensors[f"model.layers.{i}.self_attn.q_norm.weight"] = np.ones(32, np.float32)
    plain = ck.with_tensors(tensors)
    logits = {}
    for name, c in (("ours", ck), ("plain", plain)):
        for backend in ("numpy", "native"):
            engine = Engine(c, sequence_length=32, backend=backend)
            logits[name, backend] = engine.prefill(engine.add_sequence(), ids, all_logits=True)
    np.testing.assert_allclose(logits["plain", "native"], logits["plain", "numpy"], atol=TOL)
    assert np.abs(logits["ours", "native"] - logits["plain", "native"]).max() > 100 * TOL


def test_qwen_sliding_window_from_layer_types(tiny_model_dir, hf_model, hf_logits_fn,
                                              token_ids):
    """use_sliding_window with max_window_layers = 0: every layer slides (transformers'
    layer_types), and the window changes the logits; a mix of sliding and full layers is
    refused rather than run with one window everywhere."""
    folder = tiny_model_dir("qwen2_swa")
    ck = load_checkpoint(folder)
    assert ck.args.sliding_window == 8
    ids = token_ids(40, seed=9)
    engine = Engine(ck, sequence_length=48)
    ours = engine.prefill(engine.add_sequence(), ids, all_logits=True)
    np.testing.assert_allclose(ours, hf_logits_fn(hf_model(folder), ids), atol=TOL, rtol=0)
    mixed = {**ck.config, "layer_types": ["full_attention", "sliding_attention"]}
    with pytest.raises(UnsupportedConfigError, match="layer_types=.*one attention window"):
        ck.architecture.model_args(mixed)
    legacy = {k: v for k, v in mixed.items() if k != "layer_types"}  # transformers 4.x config
    assert ck.architecture.model_args({**legacy, "max_window_layers": 2}).sliding_window is None
    with pytest.raises(UnsupportedConfigError, match="max_window_layers=1"):
        ck.architecture.model_args({**legacy, "max_window_layers": 1})
    qwen3 = load_checkpoint(tiny_model_dir("qwen3"))
    with pytest.raises(UnsupportedConfigError, match="layer_types"):
        qwen3.architecture.model_args({**qwen3.config, **mixed})


def test_compressed_qwen3_loads_without_the_canonical_names_marker(tiny_model_dir, tmp_path):
    """SparseGPT + int8 on Qwen3 (QK-norm vectors pass through), and the folder read as a
    third-party compressed-tensors checkpoint: Qwen3's HF names are the canonical ones."""
    import json

    from seed_recipe import SEED_RECIPE
    from sparsellm import compress

    texts = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps.\n"] * 4
    out = tmp_path / "qwen3"
    compress(load_checkpoint(tiny_model_dir("qwen3")), texts, SEED_RECIPE, out,
             num_calibration_samples=2, max_seq_length=32, progress=False)
    config = json.loads((out / "config.json").read_text())
    config.pop("sparsellm_tensor_names", None)
    (out / "config.json").write_text(json.dumps(config))
    ck = load_checkpoint(out)
    name = "model.layers.1.self_attn.k_proj.weight"
    assert ck.weight_formats[name].name == "sparse_int8_a8" and (ck.tensors[name] == 0).mean() >= .5
    assert ck.tensors["model.layers.1.self_attn.k_norm.weight"].shape == (32,)
    ids = [5, 6, 7, 8, 9]
    a, b = (Engine(ck, sequence_length=8, backend=backend) for backend in ("native", "numpy"))
    la = a.prefill(a.add_sequence(), ids, all_logits=True)
    lb = b.prefill(b.add_sequence(), ids, all_logits=True)
    np.testing.assert_allclose(la, lb, atol=0.05 * np.abs(lb).max(), rtol=0)  # int8 activations


def test_models_lists_the_new_families(capsys):
    from sparsellm.commands import models as command

    assert command.main(argparse.Namespace(architectures=True)) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    assert "Qwen3ForCausalLM" in rows["qwen3"] and " qwen3 " in rows["qwen3"]
    assert "Llama 3.x" in rows["llama"] and "Qwen2.5" in rows["llama"]
    assert "Gemma3ForCausalLM" in rows["gemma3"] and " gemma3 " in rows["gemma3"]
