"""The weight-format registries: Python's layouts (kernels/layouts.py) and the names derived from
them agree with the C++ traits table (csrc/include/formats.h kFmtTraits), which validates every
weight."""

import numpy as np
import pytest

from sparsellm import kernels
from sparsellm.kernels._ext import native
from sparsellm.kernels.formats import FORMATS, PackedWeight, dense_twin, packed_nbytes, parse_format
from sparsellm.kernels.layouts import LAYOUTS, Sparsity


def test_python_layouts_and_native_formats_agree():
    """Every layout runs as a native format with the same capabilities, and every native format
    is some layout's: adding one on one side only fails here."""
    table = {f["name"]: f for f in native().weight_formats()}
    assert [f["id"] for f in table.values()] == list(range(len(table)))
    assert sorted(layout.native_format for layout in LAYOUTS) == sorted(table)
    for layout in LAYOUTS:
        f = table[layout.native_format]
        assert (f["value_bits"], f["float"], f["sparsity"], f["grouped"], f["asym"],
                f["superblock"]) == (
            layout.bits, layout.is_float, layout.sparsity,
            bool(layout.groups or layout.group), layout.asym, layout.superblock), layout
        assert (f["fp32_activations"], f["int8_activations"]) == (
            False in layout.act_int8, True in layout.act_int8), layout


def test_format_names_are_the_ones_users_know():
    known = (
        "fp32", "fp16", "bf16", "int8", "int8_a8",
        *(f"int4_g{g}{a}{a8}" for g in (32, 64, 128) for a in ("", "_asym") for a8 in ("", "_a8")),
        "sparse_fp32", "sparse_int8", "sparse_int8_a8",
        *(f"sparse_int4_g{g}{a8}" for g in (32, 64, 128) for a8 in ("", "_a8")),
        "2:4_int8", "2:4_int8_a8", "q4_k", "q4_k_a8",
    )
    assert known == FORMATS
    assert parse_format("sparse24_int8_a8").sparsity is Sparsity.TWO_FOUR  # an accepted spelling
    for bad in ("int3", "fp16_a8", "sparse_bf16", "sparse_int4_g32_asym", "2:4_fp32",
                "2:4_int4_g32", "int4", "int4_g16", "int8_asym", ""):
        with pytest.raises(ValueError, match="accepted: fp32, fp16"):
            parse_format(bad)


@pytest.mark.parametrize("fmt", FORMATS)
def test_spec_properties(fmt):
    s = parse_format(fmt)
    assert s.name == fmt and s.act_int8 == fmt.endswith("_a8") and s.asym == ("_asym" in fmt)
    assert s.sparse == fmt.startswith(("sparse_", "2:4_"))
    twin = parse_format(dense_twin(fmt))
    assert not twin.sparse and (twin.bits, twin.is_float, twin.act_int8, twin.group) == (
        s.bits, s.is_float, s.act_int8, s.group)
    if not s.sparse:
        assert twin == s
    w = np.random.default_rng(0).standard_normal((20, 128)).astype(np.float32)
    mask = None if not s.sparse else np.ones(w.shape, bool) if s.sparsity is Sparsity.BITMASK \
        else np.tile([True, False, True, False], (20, 32))
    p = kernels.pack(w, fmt, mask)
    assert packed_nbytes(w.shape, fmt) == p.nbytes  # bitmask formats: at density 1
    assert s.dense_twin == twin and p.spec == s and p.format == fmt  # the spec, and its name
    q = kernels.pack(w, s, mask)  # given as its spec: the same packed weight
    assert q.spec == s and packed_nbytes(w.shape, s) == q.nbytes
    for key in p.arrays:
        np.testing.assert_array_equal(p.arrays[key], q.arrays[key], err_msg=f"{fmt} {key}")


def test_float64_weights_pack_as_their_float32_values(rng):
    w = rng.standard_normal((16, 100))
    for fmt in ("fp32", "bf16", "int8", "int8_a8", "int4_g32_asym"):
        a, b = kernels.pack(w, fmt), kernels.pack(w.astype(np.float32), fmt)
        assert a.arrays.keys() == b.arrays.keys()
        for key in a.arrays:
            np.testing.assert_array_equal(a.arrays[key], b.arrays[key], err_msg=f"{fmt} {key}")


def _native_weight(fmt="SP_I8", act_int8=False, group=0, asym=False, **buffers):
    rows, kp = 4, 64
    defaults = {"data": np.zeros(kp, np.int8), "scale": np.ones(rows, np.float32),
                "mask": np.zeros((rows, kp // 8), np.uint8),
                "row_off": np.zeros(rows + 1, np.int64)}
    return native().NativeWeight(fmt=fmt, rows=rows, cols=kp, kp=kp, act_int8=act_int8,
                                 group=group, asym=asym, **{**defaults, **buffers})


def test_native_weights_are_checked_against_their_format():
    assert _native_weight().rows == 4
    for kwargs, message in [
        ({"fmt": "SP_I2"}, "unknown native weight format 'SP_I2'; accepted: F32, F16, BF16"),
        ({"fmt": "I8", "act_int8": True}, "I8 weights: no kernel for int8 activations"),
        ({"fmt": "I8_R16"}, "I8_R16 weights: no kernel for fp32 activations"),
        ({"group": 32}, "SP_I8 weights: no group scales"),
        ({"fmt": "SP_I4", "group": 48}, "SP_I4 weights: group must be 32k and divide kp"),
        ({"fmt": "SP_I4", "group": 0}, "SP_I4 weights: group must be 32k and divide kp"),
        ({"asym": True}, "SP_I8 weights: no zero points"),
        ({"scale": None}, "SP_I8 weights: scale is required"),
        ({"row_off": None}, "SP_I8 weights: row_off is required"),
        ({"fmt": "S24_I8"}, "S24_I8 weights: meta is required"),
        ({"fmt": "I4", "group": 32, "asym": True}, "I4 weights: zero is required"),
        ({"fmt": "I4K", "group": 32}, "I4K weights: group must be 32 and kp a multiple of 256"),
    ]:
        with pytest.raises(ValueError, match=message):
            _native_weight(**kwargs)


def _misaligned(a: np.ndarray) -> np.ndarray:
    """A copy of `a` one byte past an aligned address, as a file's bytes viewed in place can be
    (a GGUF whose general.alignment is 1)."""
    raw = np.zeros(a.nbytes + 1, np.uint8)
    view = raw[1:].view(a.dtype).reshape(a.shape)
    view[...] = a
    assert not view.flags.aligned
    return view


def test_native_code_refuses_misaligned_buffers(rng):
    """A kernel's load of a misaligned element is undefined behaviour, so native code refuses a
    buffer at an address that is not a multiple of its element size; PackedWeight.native()
    copies one first, so a packed weight over misaligned arrays runs as its aligned twin."""
    with pytest.raises(ValueError, match="scale: its buffer is not aligned to 4 bytes"):
        _native_weight(scale=_misaligned(np.ones(4, np.float32)))
    with pytest.raises(ValueError, match="data: its buffer is not aligned to 4 bytes"):
        _native_weight(fmt="F32", data=_misaligned(np.zeros(4 * 64, np.float32)), scale=None,
                       mask=None, row_off=None)
    p = kernels.pack(rng.standard_normal((8, 64)).astype(np.float32), "fp32")
    x = rng.standard_normal((3, 64)).astype(np.float32)
    with pytest.raises(ValueError, match="x: its buffer is not aligned"):
        native().linear(_misaligned(x), p.native(), np.empty((3, 8), np.float32), False, False)
    q = PackedWeight(spec=p.spec, shape=p.shape, kp=p.kp,
                     arrays={k: _misaligned(v) for k, v in p.arrays.items()})
    np.testing.assert_array_equal(kernels.linear(x, q), kernels.linear(x, p))
