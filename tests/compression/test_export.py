"""export(): a deployment folder that loads, runs with its sequence length, and is written
atomically; the same from `sparsellm export`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sparsellm import Pipeline, compress, export, load_checkpoint
from sparsellm.cli import main as cli_main


@pytest.fixture(scope="module")
def compressed(tiny_model, calib_texts, tmp_path_factory):
    out = tmp_path_factory.mktemp("compressed") / "model"
    compress(tiny_model, calib_texts, "SparseGPTModifier: {sparsity: 0.5}\n"
             "GPTQModifier: {scheme: W8A8, ignore: [lm_head]}", out, 4, 32, progress=False)
    return out


def test_export_copies_the_compressed_model_and_sets_the_sequence_length(compressed, tmp_path):
    dep = export(compressed, task="text-generation", sequence_length=96,
                 target_path=tmp_path / "exported")
    assert dep == (tmp_path / "exported" / "deployment").absolute()
    for f in compressed.iterdir():  # every file byte for byte (nothing re-encoded) ...
        if f.name != "tokenizer_config.json":
            assert (dep / f.name).read_bytes() == f.read_bytes(), f.name
    # ... plus the deployment settings, which the pipeline and HF tokenizers pick up.
    assert json.loads((dep / "deployment.json").read_text())["sequence_length"] == 96
    assert json.loads((dep / "tokenizer_config.json").read_text())["model_max_length"] == 96
    src, out = load_checkpoint(compressed), load_checkpoint(dep)
    assert out.weight_formats == src.weight_formats
    for name, t in src.tensors.items():
        np.testing.assert_array_equal(out.tensors[name], t)
    pipe = Pipeline.create(model_path=str(dep), max_generated_tokens=4, batch_size=1)
    assert pipe.sequence_length == 96
    assert pipe("def add(").sequences[0] == Pipeline.create(
        model_path=str(compressed), max_generated_tokens=4, batch_size=1)("def add(").sequences[0]
    assert Pipeline.create(model_path=str(dep), sequence_length=64).sequence_length == 64


def test_export_errors_and_overwrite(compressed, tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        export(compressed, task="image-classification", target_path=tmp_path)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        export(compressed, sequence_length=10**6, target_path=tmp_path)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        export(tmp_path / "nowhere", target_path=tmp_path)
    export(compressed, target_path=tmp_path, sequence_length=64)
    with pytest.raises(ValueError, match="already exists"):
        export(compressed, target_path=tmp_path)
    export(compressed, target_path=tmp_path, sequence_length=32, overwrite=True)
    assert load_checkpoint(tmp_path / "deployment").deployment["sequence_length"] == 32
    assert [p.name for p in tmp_path.iterdir()] == ["deployment"]  # no temporary leftovers


def test_cli(compressed, tmp_path, capsys):
    assert cli_main(["export", str(compressed), "--sequence-length", "48",
                     "--target-path", str(tmp_path)]) == 0
    assert "deployment" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "deployment").deployment == {
        "task": "text-generation", "sequence_length": 48, "source": str(compressed.absolute())}
    assert cli_main(["export", str(compressed), "--target-path", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err


@pytest.mark.slow
def test_export_gguf_writes_an_equivalent_hf_folder(tmp_path):
    dep = export("smollm2-135m-instruct", sequence_length=256, target_path=tmp_path)
    src, out = load_checkpoint("smollm2-135m-instruct"), load_checkpoint(dep)
    assert (src.format, out.format) == ("gguf", "safetensors")
    assert out.tensors.keys() == src.tensors.keys()
    for name, t in src.tensors.items():
        np.testing.assert_array_equal(out.tensors[name], t)
    text = "def fibonacci(n):\n    # the n-th number <|im_end|>"
    assert out.tokenizer.encode(text) == src.tokenizer.encode(text)
    assert out.eos_token_ids == src.eos_token_ids
    assert out.tokenizer.chat_template == src.tokenizer.chat_template
