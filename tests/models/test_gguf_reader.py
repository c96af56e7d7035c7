"""sparsellm's GGUF reader (models/gguf_reader.py) against gguf.GGUFReader, on small files
written with gguf.GGUFWriter (every value type, nested and string arrays, float and quantized
tensors, a non-default alignment) and on hand-built ones (what the writer refuses to write:
empty arrays, damaged headers)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from sparsellm.dtypes import BFLOAT16
from sparsellm.models import gguf_loader, gguf_reader
from sparsellm.models.gguf_loader import _stored, _stored_dtype, read_gguf_metadata
from sparsellm.models.gguf_reader import GGUFFile

SCALARS = {  # key: (value, type)
    "t.u8": (255, V.UINT8), "t.i8": (-128, V.INT8), "t.u16": (65535, V.UINT16),
    "t.i16": (-32768, V.INT16), "t.u32": (2**32 - 1, V.UINT32), "t.i32": (-(2**31), V.INT32),
    "t.f32": (0.1, V.FLOAT32), "t.u64": (2**64 - 1, V.UINT64), "t.i64": (-(2**63), V.INT64),
    "t.f64": (0.1, V.FLOAT64), "t.true": (True, V.BOOL), "t.false": (False, V.BOOL),
    "t.str": ("héllo ▁wörld 🙂", V.STRING), "t.empty_str": ("", V.STRING),
}
ARRAYS = {  # key: (values, element type)
    "a.u8": ([0, 1, 255], V.UINT8), "a.i8": ([-128, 0, 127], V.INT8),
    "a.u16": ([0, 65535], V.UINT16), "a.i16": ([-32768, 32767], V.INT16),
    "a.u32": ([0, 2**32 - 1], V.UINT32), "a.i32": ([-(2**31), 2**31 - 1], V.INT32),
    "a.f32": ([0.1, -2.5, 1e30], V.FLOAT32), "a.u64": ([0, 2**64 - 1], V.UINT64),
    "a.i64": ([-(2**63), 2**63 - 1], V.INT64), "a.f64": ([0.1, -1e300], V.FLOAT64),
    "a.bool": ([True, False, True], V.BOOL),
    "a.str": (["a", "", "▁the", "<0x0A>", "日本語", "🙂 x"], V.STRING),
}
NESTED = {  # arrays of arrays (element types inferred by the writer)
    "n.int": [[1, 2, 3], [4], [5, 6]],
    "n.str": [["a", "bc"], ["", "déf", "g"]],
    "n.float": [[0.5], [1.5, 2.5]],
}
ALIGNMENT = 64


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _q4_k_bytes(rows: int, cols: int) -> np.ndarray:
    """Random Q4_K blocks (gguf.quants cannot quantize to it) with finite scales."""
    block, size = gguf.GGML_QUANT_SIZES[Q.Q4_K]
    raw = _rng().integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    raw[:, 0:2] = np.array([0.01], np.float16).view(np.uint8)  # d
    raw[:, 2:4] = np.array([0.002], np.float16).view(np.uint8)  # dmin
    return raw.reshape(rows, cols // block * size)


def write_all_types(path: Path) -> dict[str, np.ndarray]:
    """A GGUF file with every value type and tensors of several types; returns the tensors'
    float values (before quantization)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(ALIGNMENT)
    for key, (value, kind) in SCALARS.items():
        w.add_key_value(key, value, kind)
    for key, (values, kind) in ARRAYS.items():
        w.add_key_value(key, values, V.ARRAY, sub_type=kind)
    for key, values in NESTED.items():
        w.add_array(key, values)
    rng = _rng()
    floats = {
        "f32.2d": rng.standard_normal((3, 5)).astype(np.float32),
        "f32.1d": rng.standard_normal(7).astype(np.float32),
        "f32.3d": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "f16": rng.standard_normal((4, 6)).astype(np.float16),
        "bf16": rng.standard_normal((3, 8)).astype(BFLOAT16),
        "q8_0": rng.standard_normal((4, 64)).astype(np.float32),
        "q4_0": rng.standard_normal((2, 96)).astype(np.float32),
    }
    for name in ("f32.2d", "f32.1d", "f32.3d", "f16"):
        w.add_tensor(name, floats[name])
    w.add_tensor("bf16", floats["bf16"].view(np.uint8), raw_dtype=Q.BF16)
    w.add_tensor("q8_0", gguf.quants.quantize(floats["q8_0"], Q.Q8_0), raw_dtype=Q.Q8_0)
    w.add_tensor("q4_0", gguf.quants.quantize(floats["q4_0"], Q.Q4_0), raw_dtype=Q.Q4_0)
    w.add_tensor("q4_k", _q4_k_bytes(2, 512), raw_dtype=Q.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return floats


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gguf_reader") / "all_types.gguf"
    return path, write_all_types(path)


@pytest.fixture
def all_types(written) -> Path:
    return written[0]


def flatten(value: Any) -> Any:
    """An array of arrays as GGUFReader's contents() gives it: one flat list."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        return [x for v in value for x in flatten(v)]
    return value


def assert_same_values(ours: Any, theirs: Any, key: str) -> None:
    """Equal, element by element of the same Python type (True == 1, 1 == 1.0 in Python)."""
    assert type(ours) is type(theirs), (key, ours, theirs)
    if isinstance(ours, list):
        assert len(ours) == len(theirs), key
        for a, b in zip(ours, theirs, strict=True):
            assert_same_values(a, b, key)
    else:
        assert ours == theirs, (key, ours, theirs)


def assert_same_as_gguf_reader(path: Path) -> tuple[GGUFFile, gguf.GGUFReader]:
    ours, theirs = GGUFFile(path), gguf.GGUFReader(str(path))
    meta, expected = read_gguf_metadata(ours), read_gguf_metadata(theirs)
    assert list(meta) == list(expected)
    for key in expected:
        assert_same_values(flatten(meta[key]), expected[key], key)
    assert ours.alignment == theirs.alignment and ours.data_offset == theirs.data_offset
    assert ours.version == theirs.fields["GGUF.version"].contents()
    assert len(ours.tensors) == len(theirs.tensors)
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.name, a.tensor_type, a.offset) == (b.name, b.tensor_type, b.data_offset)
        assert a.dims == tuple(b.shape.tolist()) and a.shape == tuple(reversed(a.dims))
        assert (a.n_elements, a.n_bytes) == (b.n_elements, b.n_bytes)
        data = a.data
        assert not data.flags.writeable and np.shares_memory(data, ours._map)  # mapped, no copy
        assert data.tobytes() == b.data.tobytes()
        if a.tensor_type == Q.BF16:  # GGUFReader: uint8 rows of bytes; ours: typed
            assert data.dtype == BFLOAT16 and data.shape == a.shape
        else:
            assert (data.dtype, data.shape) == (b.data.dtype, b.data.shape)
    return ours, theirs


def test_every_value_type_and_tensor_type_as_gguf_reader_reads_them(all_types):
    ours, _ = assert_same_as_gguf_reader(all_types)
    meta = ours.metadata
    for key, (value, kind) in SCALARS.items():
        expected = float(np.float32(value)) if kind == V.FLOAT32 else value
        assert_same_values(meta[key], expected, key)
    for key, (values, kind) in ARRAYS.items():
        expected = np.float32(values).tolist() if kind == V.FLOAT32 else values
        assert_same_values(meta[key], expected, key)
    for key, values in NESTED.items():  # GGUFReader flattens these; we keep the nesting
        expected = [np.float32(v).tolist() for v in values] if key == "n.float" else values
        assert_same_values(meta[key], expected, key)
    assert meta["general.alignment"] == ALIGNMENT == ours.alignment
    assert ours.data_offset % ALIGNMENT == 0
    assert all(t.offset % ALIGNMENT == 0 for t in ours.tensors)
    assert {t.tensor_type for t in ours.tensors} == {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0,
                                                     Q.Q4_K}


def test_stored_tensors_as_from_gguf_reader(written):
    """What the loader makes of each tensor: float types as typed views in (rows, cols) order,
    quantized ones dequantized from the same bytes GGUFReader gives."""
    all_types, floats = written
    ours, theirs = GGUFFile(all_types), gguf.GGUFReader(str(all_types))
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        w = _stored(a)
        assert w.dtype == _stored_dtype(a) and w.shape == a.shape
        if a.tensor_type in (Q.F32, Q.F16, Q.BF16):
            assert not w.flags.writeable and np.shares_memory(w, ours._map)
            np.testing.assert_array_equal(w, floats[a.name])
        else:
            expected = gguf.quants.dequantize(b.data, b.tensor_type).reshape(a.shape)
            np.testing.assert_array_equal(w, expected)
            assert w.dtype == np.float32 and np.isfinite(w).all()
            if a.name in floats:
                np.testing.assert_allclose(w, floats[a.name], atol=0.3)


def test_type_codes_are_the_gguf_packages():
    """The reader and loader name value and tensor types by code (to import gguf lazily)."""
    assert (gguf_reader._UINT32, gguf_reader._STRING, gguf_reader._ARRAY) == (V.UINT32, V.STRING,
                                                                              V.ARRAY)
    numpy_types = gguf.GGUFReader.gguf_scalar_to_np
    assert set(gguf_reader._SCALARS) == {int(k) for k in numpy_types}
    for code, (packing, dtype) in gguf_reader._SCALARS.items():
        assert dtype == np.dtype(numpy_types[V(code)]).newbyteorder("<")
        assert packing.size == dtype.itemsize
    assert {Q(k).name: v for k, v in gguf_reader._NUMPY_TYPES.items()} == {
        "F32": np.float32, "F16": np.float16, "BF16": BFLOAT16, "F64": np.float64,
        "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64}
    assert {Q(k).name for k in gguf_loader._FLOAT_TYPES} == {"F32", "F16", "BF16"}


# ---- hand-built files ---------------------------------------------------------------------------

def gguf_string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def build(kvs: list[bytes], tensors: list[tuple[str, tuple[int, ...], int, int]] = (),
          *, version: int = 3, alignment: int = 32, data: bytes = b"") -> bytes:
    """A GGUF file from encoded key/values (key string + type + value) and tensor infos
    (name, dims, ggml type, offset), its data section aligned to `alignment`."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    for name, dims, kind, offset in tensors:
        head += gguf_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, kind,
                                                offset)
    return head + b"\0" * (-len(head) % alignment) + data


def kv(key: str, kind: int, value: bytes) -> bytes:
    return gguf_string(key) + struct.pack("<I", kind) + value


def test_empty_arrays_and_version_2(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(build([
        kv("general.architecture", V.STRING, gguf_string("llama")),
        kv("e.u32", V.ARRAY, struct.pack("<IQ", V.UINT32, 0)),
        kv("e.str", V.ARRAY, struct.pack("<IQ", V.STRING, 0)),
        kv("after", V.INT32, struct.pack("<i", -7)),
    ], [("w", (4,), Q.F32, 0)], version=2, data=np.arange(4, dtype=np.float32).tobytes()))
    ours, _ = assert_same_as_gguf_reader(path)
    assert ours.version == 2
    assert ours.metadata == {"general.architecture": "llama", "e.u32": [], "e.str": [],
                             "after": -7}
    np.testing.assert_array_equal(ours.tensors[0].data, [0, 1, 2, 3])


def test_a_large_vocabulary(tmp_path):
    """String arrays are parsed in one pass (GGUFReader makes a NumPy view per element)."""
    rng = _rng()
    tokens = [f"▁tok{i}" + "é" * int(rng.integers(0, 4)) for i in range(50_000)]
    path = tmp_path / "vocab.gguf"
    path.write_bytes(build([
        kv("tokenizer.ggml.tokens", V.ARRAY, struct.pack("<IQ", V.STRING, len(tokens))
           + b"".join(gguf_string(t) for t in tokens)),
        kv("tokenizer.ggml.scores", V.ARRAY, struct.pack("<IQ", V.FLOAT32, len(tokens))
           + np.arange(len(tokens), dtype="<f4").tobytes()),
    ]))
    meta = GGUFFile(path).metadata
    assert meta["tokenizer.ggml.tokens"] == tokens
    assert meta["tokenizer.ggml.scores"] == list(map(float, range(len(tokens))))


# ---- refused files ------------------------------------------------------------------------------

def refused(path: Path, data: bytes, match: str) -> None:
    path.write_bytes(data)
    with pytest.raises(ValueError, match=match) as e:
        GGUFFile(path)
    assert str(e.value).startswith(f"{path}: ")


def test_header_cut_anywhere_is_refused_as_truncated(all_types, tmp_path):
    """Cut at every byte of the header and tensor table: a truncated header, or (once the
    table is whole) the tensor whose data the cut falls in, never a NumPy or struct error."""
    data = all_types.read_bytes()
    end = GGUFFile(all_types).data_offset
    path = tmp_path / "cut.gguf"
    for size in range(4, end + 1):
        refused(path, data[:size], r"truncated GGUF header: (the header|key/value \d+|key "
                r"'[^']+'|tensor info \d+|tensor \S+'s info) at byte \d+ runs past the end of "
                rf"the file \({size} bytes; an interrupted download or copy\?\)$|truncated: "
                rf"tensor \S+ ends at byte \d+ but the file has {size} bytes \(an interrupted")


def test_tensor_data_cut_names_the_tensor(all_types, tmp_path):
    data = all_types.read_bytes()
    last = GGUFFile(all_types).tensors[-1]
    refused(tmp_path / "cut.gguf", data[:last.offset + 1],
            rf"truncated: tensor {last.name} ends at byte {last.offset + last.n_bytes} but the "
            rf"file has {last.offset + 1} bytes \(an interrupted download or copy\?\)$")


@pytest.mark.parametrize("data, match", [
    (b"GGML" + b"\0" * 20, r"not a GGUF file \(it starts with b'GGML', not b'GGUF'\)$"),
    (b"", r"not a GGUF file \(it starts with b'', not b'GGUF'\)$"),
    (build([], version=1),
     r"unsupported GGUF version 1 at byte 4 \(sparsellm reads versions 2 and 3\)$"),
    (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), r"a big-endian GGUF file"),
    (build([kv("k", 13, b"\0" * 8)]), r"corrupt GGUF header: key 'k' has unknown value type 13"),
    (build([kv("k", V.ARRAY, struct.pack("<IQ", 99, 1))]),
     r"corrupt GGUF header: key 'k' is an array of unknown value type 99"),
    (build([kv("k", V.UINT8, b"\1"), kv("k", V.UINT8, b"\2")]),
     r"corrupt GGUF header: duplicate key 'k'"),
    (build([kv("k", V.STRING, gguf_string(b"\xff\xfe"))]), r"corrupt GGUF header: .* not UTF-8"),
    (build([kv("k", V.ARRAY, struct.pack("<IQ", V.STRING, 1) + gguf_string(b"a\xff"))]),
     r"corrupt GGUF header: a string of key 'k' at byte \d+ is not UTF-8"),
    (build([kv("general.alignment", V.UINT32, struct.pack("<I", 48))]),
     r"corrupt GGUF header: general.alignment 48 is not a power of two"),
    (build([kv("general.alignment", V.UINT64, struct.pack("<Q", 64))]),
     r"corrupt GGUF header: general.alignment is not a uint32"),
    (build([kv("k", V.ARRAY, struct.pack("<IQ", V.STRING, 2**62))]),
     r"truncated GGUF header"),
    (build([], [("w", (4,), 99, 0)], data=b"\0" * 16),
     r"corrupt GGUF tensor table \(tensor w has unknown ggml type 99\)$"),
    (build([], [("w", (4,), Q.F32, 0), ("w", (4,), Q.F32, 0)], data=b"\0" * 16),
     r"corrupt GGUF tensor table \(duplicate tensor w\)$"),
    (build([], [("w", (16, 2), Q.Q8_0, 0)], data=b"\0" * 34),
     r"corrupt GGUF tensor table \(tensor w: row size 16 is not a multiple of the Q8_0 block "
     r"size 32\)$"),
])
def test_damaged_files_are_refused_by_name(tmp_path, data, match):
    refused(tmp_path / "bad.gguf", data, match)
