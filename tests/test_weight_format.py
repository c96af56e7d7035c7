"""The format vocabulary (sparsellm/weight_format.py): one name grammar for the kernels' FORMATS
and checkpoints' WeightFormat, one set of sparsity kinds."""

import json

import pytest

from sparsellm.kernels import FORMATS, parse_format
from sparsellm.kernels.formats import _SPECS, spec_for
from sparsellm.weight_format import (
    SPARSITY_PREFIXES,
    FormatName,
    Sparsity,
    WeightFormat,
    format_name,
    parse_name,
)


@pytest.mark.parametrize("name", list(_SPECS))
def test_every_kernel_name_parses_to_its_spec_and_back(name):
    parts, spec = parse_name(name), parse_format(name)
    assert (parts.values, parts.sparsity, parts.asym, parts.act_int8) == \
        (spec.layout.values, spec.sparsity, spec.asym, spec.act_int8)
    assert parts.group in (0, spec.group)  # q4_k's group is its values' form, not in the name
    prefix = SPARSITY_PREFIXES[parts.sparsity].index(name[:len(name) - len(
        format_name(parts.values, None, parts.group, parts.asym, parts.act_int8))])
    assert format_name(parts.values, parts.sparsity, parts.group, parts.asym, parts.act_int8,
                       prefix) == name
    assert spec.dense_twin.name == format_name(parts.values, None, parts.group, parts.asym,
                                               parts.act_int8)
    assert spec.dense_twin.sparsity is None and (spec.dense_twin is spec) == (not spec.sparse)


@pytest.mark.parametrize("name", [n for n in FORMATS if n not in ("fp16", "bf16")])
def test_weight_format_names_are_the_kernel_names(name):
    """Every format a checkpoint can declare is named as the kernels name it, and back: the
    two conversions, FormatSpec.declared and spec_for, are each other's inverse."""
    fmt = parse_format(name).declared
    assert fmt == WeightFormat.from_name(name) and fmt.name == name
    spec = spec_for(fmt)
    assert spec == parse_format(name) and spec.declared == fmt
    assert (fmt.bits, fmt.sparsity, fmt.activation_bits == 8) == \
        (spec.bits, spec.sparsity, spec.act_int8)
    assert bool(fmt.superblock) == bool(spec.layout.superblock)


def test_the_old_spellings_still_name_the_same_formats():
    # WeightFormat's fields as checkpoints and recipes set them (strings)
    assert WeightFormat(bits=8, sparsity="unstructured").name == "sparse_int8"
    assert WeightFormat(bits=8, sparsity="2:4", activation_bits=8).name == "2:4_int8_a8"
    assert WeightFormat(bits=4, group_size=32, symmetric=False, superblock=256).name == "q4_k"
    assert WeightFormat(bits=4, group_size=128, symmetric=False).name == "int4_g128_asym"
    assert WeightFormat(bits=8, sparsity="4:8").name == "4:8_int8"  # no kernel runs it
    assert WeightFormat(sparsity=Sparsity.BITMASK) == WeightFormat(sparsity="unstructured")
    assert parse_name("sparse24_int8_a8") == FormatName("int8", Sparsity.TWO_FOUR, 0, False, True)
    # compressed-tensors' sparsity_structure names, as JSON writes them
    assert json.dumps([Sparsity.BITMASK, Sparsity.TWO_FOUR]) == '["unstructured", "2:4"]'
    for bad in ("int8_b8", "sparse_", "int4_g", "fp16_asym_x"):
        with pytest.raises(ValueError, match="not a weight format name"):
            parse_name(bad)
    with pytest.raises(ValueError, match="declares no WeightFormat"):
        WeightFormat.from_name("bf16")
    assert parse_format("bf16").declared is None and parse_format("fp16").declared is None
    assert spec_for(WeightFormat(bits=8, symmetric=False)) is None  # no kernel runs int8_asym
