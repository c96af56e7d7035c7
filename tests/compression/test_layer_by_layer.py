"""Compression at real sizes runs layer by layer (issue 32): the checkpoint's weights are read
when their layer runs, a finished layer is kept only in its encoded (stored) form, and the
result is the same as encoding at the end."""

from __future__ import annotations

import numpy as np

from sparsellm.compression import parse_recipe
from sparsellm.compression.calibration import SequentialCompressor, calibration_samples
from sparsellm.compression.recipe import build_plan, weight_modules
from sparsellm.models import load_checkpoint
from sparsellm.models.lazy import LazyTensors

RECIPE = """
SparseGPTModifier: {sparsity: 0.5, mask_structure: "0:0", targets: ["re:.*proj$"]}
QuantizationModifier: {scheme: W8A8, ignore: [lm_head]}
"""


def _compressor(ckpt, texts, reads: list[str] | None = None) -> SequentialCompressor:
    if reads is not None:  # record which tensors are read from the checkpoint, in order
        source = ckpt.tensors
        ckpt = ckpt.with_tensors(LazyTensors({
            n: (lambda n=n: (reads.append(n), source[n])[1]) for n in source}))
    args = ckpt.args
    plan = build_plan(parse_recipe(RECIPE), weight_modules(list(ckpt.tensors),
                      args.num_hidden_layers, True), "lm_head.weight" not in ckpt.tensors)
    samples = calibration_samples(ckpt.tokenizer, texts, 4, 32)
    return SequentialCompressor(ckpt, plan, samples, progress=False)


def test_layers_are_read_in_turn_and_kept_encoded(tiny_model, calib_texts):
    reads: list[str] = []
    compressor = _compressor(load_checkpoint(tiny_model), calib_texts, reads)
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


def test_zeros_counted_as_it_goes_match_the_stored_bitmasks(tiny_model, calib_texts):
    """The writer's sparsity figures come from counts taken during the run (the fp32 weights
    are gone by then): they must match what the stored bitmasks say."""
    model = _compressor(load_checkpoint(tiny_model), calib_texts).run().model
    sparse = [n for n, f in model.formats.items() if f.sparsity]
    assert len(sparse) == 14
    for name in sparse:
        parts = model.encoded[name]
        module = name.removesuffix(".weight")
        rows, cols = parts[f"{module}.shape"]
        kept = int(np.unpackbits(parts[f"{module}.bitmask"], axis=1, count=int(cols)).sum())
        assert model.zeros[name] == rows * cols - kept, name
        assert 0.45 < model.zeros[name] / (rows * cols) < 0.6, name
