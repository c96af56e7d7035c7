"""Every non-Llama architecture (issue #8) against transformers: tiny random models built from a
config (no download) load from their HF folders and give transformers' logits, on the NumPy
reference and on the native runtime, and the same 32-token greedy continuation; native int8 /
sparse formats equal the NumPy reference on the same weights."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from arch_variants import ARCH_VARIANTS
from sparsellm.engine import Engine
from sparsellm.models import load_checkpoint
from sparsellm.models.convert import UnsupportedConfigError, interleaved_to_half_split

TOL = 1e-3  # max |logit difference| to transformers (the assertion message shows the figure)


def greedy(engine: Engine, ids: list[int], n: int,
           forced: list[int] | None = None) -> tuple[list[int], np.ndarray]:
    """n greedy tokens (EOS ignored) and the logits of every step; `forced` decodes given
    tokens instead."""
    seq = engine.add_sequence()
    rows = [engine.prefill(seq, ids, all_logits=True)]
    out: list[int] = []
    for _ in range(n):
        out.append(forced[len(out)] if forced else int(np.argmax(rows[-1][-1])))
        rows.append(engine.decode_step([seq], [out[-1]]))
    engine.release(seq)
    return out, np.concatenate(rows)


def hf_greedy(model: torch.nn.Module, ids: list[int], n: int) -> list[int]:
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None  # exactly n tokens, like `greedy`
    config.pad_token_id = 0
    config.max_new_tokens, config.min_new_tokens, config.do_sample = n, 0, False
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), generation_config=config,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("backend", ["numpy", "native"])
@pytest.mark.parametrize("variant", ARCH_VARIANTS)
def test_logits_match_transformers(variant, backend, tiny_model_dir, hf_model, hf_logits_fn,
                                   token_ids):
    folder = tiny_model_dir(variant)
    ids = token_ids(100, seed=1)
    ref = hf_logits_fn(hf_model(folder), ids)
    engine = Engine(folder, sequence_length=128, prompt_processing_sequence_length=32,
                    backend=backend)
    ours = engine.prefill(engine.add_sequence(), ids, all_logits=True)
    assert np.abs(ref).max() > 1.0, "logits too small for the comparison to mean anything"
    np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0, err_msg=f"{variant}/{backend}")


@pytest.mark.parametrize("variant", ARCH_VARIANTS)
def test_greedy_continuation_matches_transformers_generate(variant, tiny_model_dir, hf_model,
                                                           token_ids):
    folder = tiny_model_dir(variant)
    ids = token_ids(12, seed=4)
    want = hf_greedy(hf_model(folder), ids, 32)
    got, _ = greedy(Engine(folder, sequence_length=64), ids, 32)
    assert got == want


@pytest.mark.parametrize("fmt", ["int8", "int8_a8", "sparse_int8", "sparse_int8_a8", "int4_g32"])
@pytest.mark.parametrize("variant", ARCH_VARIANTS)
def test_native_formats_equal_numpy_reference(variant, fmt, tiny_model_dir, token_ids):
    ck = load_checkpoint(tiny_model_dir(variant))
    ids = token_ids(40, seed=2)
    native = Engine(ck, sequence_length=64, weights=fmt, dynamic_int8=False)
    numpy_ = Engine(ck, sequence_length=64, weights=fmt, backend="numpy")
    tokens, lb = greedy(numpy_, ids, 8)
    _, la = greedy(native, ids, 8, forced=tokens)  # int8 activations may flip an argmax
    # int8 activations (max / 127.5 per token) vs the fp32 reference: up to ~7% of the logit
    # range at one position of the tiny phi3; a wrong layout or scale is ~100%
    tol = 0.1 if fmt.endswith("_a8") else 2e-4
    np.testing.assert_allclose(la, lb, atol=tol * np.abs(lb).max(), rtol=0)


@pytest.mark.parametrize("variant", ["gpt2", "gpt_neox", "gpt_neox_sequential", "phi2", "phi3"])
def test_gguf_logits_match_transformers(variant, tiny_arch_gguf, hf_logits_fn, token_ids):
    """GGUF files of the architectures llama.cpp defines (written like its converter does)."""
    path, model = tiny_arch_gguf(variant)
    ck = load_checkpoint(path)
    assert ck.format == "gguf" and ck.config["model_type"] != "llama"
    ids = token_ids(60, seed=5)
    ref = hf_logits_fn(model, ids)
    for backend in ("numpy", "native"):
        engine = Engine(ck, sequence_length=64, backend=backend)
        ours = engine.prefill(engine.add_sequence(), ids, all_logits=True)
        np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0, err_msg=f"{variant}/gguf/{backend}")


def test_interleaved_rope_permutation_is_exact():
    """GPT-J/CodeGen's interleaved RoPE == half-split RoPE on permuted q/k rows."""
    rng = np.random.default_rng(0)
    heads, hd, rot = 2, 12, 8
    q, k = rng.standard_normal((2, heads * hd))
    theta = 1.0 / 10000 ** (np.arange(0, rot, 2) / rot) * 7.0  # position 7

    def interleaved(x):
        x = x.reshape(heads, hd).copy()
        a, b = x[:, 0:rot:2].copy(), x[:, 1:rot:2].copy()
        x[:, 0:rot:2] = a * np.cos(theta) - b * np.sin(theta)
        x[:, 1:rot:2] = b * np.cos(theta) + a * np.sin(theta)
        return x

    def half_split(x):
        x = x.reshape(heads, hd).copy()
        a, b = x[:, :rot // 2].copy(), x[:, rot // 2:rot].copy()
        x[:, :rot // 2] = a * np.cos(theta) - b * np.sin(theta)
        x[:, rot // 2:rot] = b * np.cos(theta) + a * np.sin(theta)
        return x

    want = (interleaved(q) * interleaved(k)).sum(-1)
    qp, kp = (interleaved_to_half_split(v, heads, hd, rot) for v in (q, k))
    np.testing.assert_allclose((half_split(qp) * half_split(kp)).sum(-1), want, rtol=1e-12)


@pytest.mark.parametrize("variant,key,value,message", [
    ("gpt2", "scale_attn_by_inverse_layer_idx", True, "scale_attn_by_inverse_layer_idx=True"),
    ("opt", "do_layer_norm_before", False, "do_layer_norm_before=False .*post-LayerNorm"),
    ("opt", "word_embed_proj_dim", 32, "word_embed_proj_dim=32 .*project_in"),
    ("phi2", "qk_layernorm", True, "qk_layernorm=True"),
    ("gptj", "rotary_dim", None, "rotary_dim=null"),
    ("gpt2", "activation_function", "swiglu_x", "activation_function='swiglu_x'"),
])
def test_unsupported_config_variants_are_refused(variant, key, value, message, tiny_model_dir):
    ck = load_checkpoint(tiny_model_dir(variant))
    with pytest.raises(UnsupportedConfigError, match=message):
        ck.architecture.model_args({**ck.config, key: value})


def test_sequence_length_beyond_learned_positions_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="longer than the 512 positions this model learned"):
        Engine(tiny_model_dir("gpt2"), sequence_length=513)
    Engine(tiny_model_dir("gpt2"), sequence_length=512)


def test_phi3_longrope_is_refused(tiny_model_dir):
    ck = load_checkpoint(tiny_model_dir("phi3"))
    ck.config = {**ck.config, "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4,
                                                  "short_factor": [1.0] * 8,
                                                  "long_factor": [1.0] * 8}}
    with pytest.raises(ValueError, match="unsupported rope_scaling type 'longrope'"):
        Engine(ck, sequence_length=16)


def _copy_with(folder, tmp_path, config_update=None, tensors_update=None, drop=()):
    import json
    import shutil

    from safetensors.numpy import load_file, save_file

    out = tmp_path / "copy"
    shutil.copytree(folder, out)
    if config_update:
        config = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**config, **config_update}))
    tensors = {k: v for k, v in load_file(out / "model.safetensors").items() if k not in drop}
    save_file({**tensors, **(tensors_update or {})}, out / "model.safetensors")
    return out


def test_unknown_and_missing_tensors_are_clear_errors(tiny_model_dir, tmp_path):
    src = tiny_model_dir("phi2")
    extra = _copy_with(src, tmp_path / "a", tensors_update={
        "model.layers.0.self_attn.q_layernorm.weight": np.ones(16, np.float32)})
    with pytest.raises(ValueError, match=r"unexpected tensors for this architecture: "
                                         r"\['model.layers.0.self_attn.q_layernorm.weight'\]"):
        load_checkpoint(extra)
    missing = _copy_with(src, tmp_path / "b", drop=("model.layers.1.mlp.fc2.bias",))
    with pytest.raises(ValueError,
                       match=r"missing tensors \['model.layers.1.mlp.down_proj.bias'\]"):
        load_checkpoint(missing)


def test_third_party_compressed_checkpoints_of_other_architectures_are_refused(
        tiny_model_dir, tmp_path):
    folder = _copy_with(tiny_model_dir("opt"), tmp_path, config_update={"quantization_config": {
        "quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {}}})
    with pytest.raises(ValueError, match="compressed-tensors checkpoints of OPTForCausalLM are "
                                         "supported as sparsellm writes them"):
        load_checkpoint(folder)
