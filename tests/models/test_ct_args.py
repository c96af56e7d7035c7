"""compressed-tensors' quantization arguments <-> WeightFormat (models/ct_args.py), the one
codec the presets, the writer and the reader share."""

import pytest

from sparsellm.compression.modifiers import PRESET_SCHEMES, QuantizationArgs
from sparsellm.compression.save import scheme
from sparsellm.kernels import FORMATS, parse_format
from sparsellm.models.ct_args import activation_args, scheme_args, weight_args, weight_format
from sparsellm.weight_format import WeightFormat

# every integer format a compressed-tensors config group declares (no K-quants: GGUF's)
DECLARABLE = [f for f in (parse_format(n).declared for n in FORMATS)
              if f is not None and f.bits < 32 and not f.superblock and not f.sparsity]


@pytest.mark.parametrize("fmt", DECLARABLE, ids=lambda f: f.name)
def test_arguments_read_back_as_the_format(fmt):
    args = scheme_args(fmt)
    assert weight_format(args["weights"], args.get("input_activations"), fmt.group_size) == fmt
    # the writer's form (with compressed-tensors' other keys) reads back the same, and the
    # recipe parser accepts both
    written = scheme(fmt)
    assert weight_format(written["weights"], written["input_activations"], fmt.group_size) == fmt
    QuantizationArgs(**written["weights"])
    if fmt.activation_bits:
        assert QuantizationArgs(**written["input_activations"]).strategy == "token"


def test_presets_and_written_groups_are_compressed_tensors_arguments():
    a8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
          "group_size": None, "dynamic": True}
    w4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
          "group_size": 128, "dynamic": False}
    assert PRESET_SCHEMES["W4A8"] == {"weights": w4, "input_activations": a8}
    assert PRESET_SCHEMES["W4A16_ASYM"] == {"weights": {**w4, "symmetric": False}}
    assert PRESET_SCHEMES["W8A16"]["weights"]["strategy"] == "channel"
    assert list(scheme(WeightFormat(bits=8, activation_bits=8))["weights"]) == [
        "num_bits", "type", "symmetric", "strategy", "group_size", "dynamic", "actorder",
        "observer", "observer_kwargs", "block_structure"]
    assert scheme(WeightFormat(bits=8))["input_activations"] is None
    assert activation_args(WeightFormat(bits=4, group_size=32)) is None
    assert weight_args(WeightFormat(bits=8))["group_size"] is None
    # compressed-tensors' defaults for keys a config leaves out: 8 bits, symmetric
    assert weight_format({}, {}) == WeightFormat(bits=8)
    assert weight_format({}, {"strategy": "token"}) == WeightFormat(bits=8, activation_bits=8)
