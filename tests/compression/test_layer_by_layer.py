"""Compression at real sizes runs layer by layer (issue 32): the checkpoint's weights are read
when their layer runs, a finished layer is kept only in its encoded (stored) form, and the
result is the same as encoding at the end."""

from __future__ import annotations

import numpy as np
import pytest

from sparsellm.compression import parse_recipe
from sparsellm.compression.calibration import SequentialCompressor, calibration_samples
from sparsellm.compression.plan import weight_modules
from sparsellm.compression.recipe import build_plan
from sparsellm.models import load_checkpoint
from sparsellm.models.lazy import LazyTensors

RECIPE = """
SparseGPTModifier: {sparsity: 0.5, mask_structure: "0:0", targets: ["re:.*proj$"]}
QuantizationModifier: {scheme: W8A8, ignore: [lm_head]}
"""


def _compressor(ckpt, texts, sparsity_format: str = "dense",
                reads: list[str] | None = None) -> SequentialCompressor:
    if reads is not None:  # record which tensors are read from the checkpoint, in order
        source = ckpt.tensors
        ckpt = ckpt.with_tensors(LazyTensors({
            n: (lambda n=n: (reads.append(n), source[n])[1]) for n in source}))
    args = ckpt.args
    plan = build_plan(parse_recipe(RECIPE), weight_modules(list(ckpt.tensors),
                      args.num_hidden_layers, True), "lm_head.weight" not in ckpt.tensors)
    samples = calibration_samples(ckpt.tokenizer, texts, 4, 32)
    return SequentialCompressor(ckpt, plan, samples, progress=False,
                                sparsity_format=sparsity_format)


def test_layers_are_read_in_turn_and_kept_encoded(tiny_model, calib_texts):
    reads: list[str] = []
    compressor = _compressor(load_checkpoint(tiny_model), calib_texts, reads=reads)
    held = []  # fp32 weights held in memory when each layer is done
    finish = compressor._finish

    def record(prefix: str) -> None:
        finish(prefix)
        held.append(sorted(compressor.updated))

    compressor._finish = record
    run = compressor.run()
    # Layer 1's weights are first read after layer 0 is finished (layer by layer)...
    first_read = {i: min(k for k, n in enumerate(reads) if n.startswith(f"model.layers.{i}."))
                  for i in (0, 1)}
    last_read0 = max(k for k, n in enumerate(reads) if n.startswith("model.layers.0.") and
                     n.endswith("proj.weight"))
    assert last_read0 < first_read[1]
    # ... and nothing compressed stays in fp32 once its layer is done.
    assert held[:2] == [[], []] and not compressor.updated
    model = run.model
    linear = [n for n in model.formats if n.startswith("model.layers.")]
    assert len(linear) == 14 and all(n in model.encoded for n in linear)
    assert not model.quantized and not model.masks  # only the encoded form is kept


@pytest.mark.parametrize("sparsity_format", ["dense", "sparse-bitmask"])
def test_zeros_counted_as_it_goes_match_the_stored_weights(tiny_model, calib_texts,
                                                           sparsity_format):
    """The writer's sparsity figures come from counts taken during the run (the fp32 weights
    are gone by then): they must match what the stored weights (or bitmasks) say."""
    model = _compressor(load_checkpoint(tiny_model), calib_texts, sparsity_format).run().model
    sparse = [n for n, f in model.formats.items() if f.sparsity]
    assert len(sparse) == 14
    for name in sparse:
        parts = model.encoded[name]
        module = name.removesuffix(".weight")
        if sparsity_format == "dense":
            rows, cols = parts[name].shape
            kept = int(np.count_nonzero(parts[name]))  # symmetric int8: a pruned weight is 0
        else:
            rows, cols = parts[f"{module}.shape"]
            kept = int(np.unpackbits(parts[f"{module}.bitmask"], axis=1, count=int(cols)).sum())
        assert model.zeros[name] == rows * cols - kept, name
        assert 0.45 < model.zeros[name] / (rows * cols) < 0.6, name


def test_bf16_source_keeps_its_untouched_tensors_bf16(tmp_path, tiny_tokenizer_dir, calib_texts):
    """What compression does not touch (norms, an ignored lm_head, the embedding) is written as
    the source stores it, and runs that way: a bf16 lm_head is not widened to fp32."""
    from bf16_models import write_bf16_model
    from sparsellm.compression import compress
    from sparsellm.dtypes import BFLOAT16
    from sparsellm.engine import Engine
    from sparsellm.models.safetensors_io import SafetensorsFile

    source = write_bf16_model(tmp_path / "src", tiny_tokenizer_dir, hidden=64, layers=2,
                              intermediate=128)
    out = compress(str(source), calib_texts, RECIPE, tmp_path / "out",
                   num_calibration_samples=4, max_seq_length=32, progress=False).output_dir
    stored = SafetensorsFile(out / "model.safetensors")
    for name in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"):
        assert stored.dtype(name) == BFLOAT16, name
    assert stored.dtype("model.layers.0.mlp.up_proj.weight") == np.int8
    engine = Engine(out, sequence_length=32, weights_cache=False)
    assert engine.formats["lm_head.weight"] == "bf16"
    assert engine.formats["model.layers.0.mlp.up_proj.weight"] == "sparse_int8_a8"
