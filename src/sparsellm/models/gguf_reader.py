"""A fast reader of the GGUF container (versions 2 and 3, little-endian): the header, every
key/value, the tensor table, and each tensor's data as a read-only view of a memory map of the
file.

`gguf.GGUFReader` builds a NumPy view for every element of every metadata array (14 s for the
262144 tokens of Gemma 3's vocabulary); this one parses the header with `struct` over one memory
map and turns each array into Python values at once (`np.frombuffer(...).tolist()` for numbers, a
tight loop for strings). Values have the types `ReaderField.contents()` gives: str, int, float,
bool, and lists of them; an array of arrays is a list of lists (GGUFReader flattens it).

Layout (gguf/gguf_reader.py, llama.cpp's gguf.h): magic "GGUF", u32 version, u64 tensor count,
u64 key/value count; each key/value: string key, u32 value type, value; each tensor info: string
name, u32 n_dims, n_dims x u64 dims (fastest-varying first), u32 ggml type, u64 offset from the
start of the data section, which begins at the next multiple of `general.alignment` (default 32)
after the tensor table. A string is a u64 byte length and UTF-8 bytes; an array a u32 element type,
a u64 count and the elements.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import BFLOAT16
from .safetensors_io import INTERRUPTED

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
SUPPORTED_VERSIONS = (2, 3)

# Value types by their gguf.GGUFValueType code (`gguf` itself is imported once a file is
# opened): the fixed-size ones with their struct format (scalars) and NumPy dtype (arrays).
_UINT32, _STRING, _ARRAY = 4, 8, 9
_SCALARS: dict[int, tuple[struct.Struct, np.dtype]] = {
    kind: (struct.Struct("<" + f), np.dtype("<" + f))
    for kind, f in [(0, "B"), (1, "b"), (2, "H"), (3, "h"), (4, "I"), (5, "i"), (6, "f"),
                    (7, "?"), (10, "Q"), (11, "q"), (12, "d")]
}
_U32, _U64 = _SCALARS[_UINT32][0], _SCALARS[10][0]
_HEADER = struct.Struct("<4sIQQ")

# Tensor types (by gguf.GGMLQuantizationType code) NumPy holds in their own dtype: F32, F16,
# I8, I16, I32, I64, F64, BF16. All others are quantized blocks, given as uint8 rows of bytes
# (what gguf.quants.dequantize takes).
_NUMPY_TYPES = {
    0: np.dtype("<f4"), 1: np.dtype("<f2"), 24: np.dtype("i1"), 25: np.dtype("<i2"),
    26: np.dtype("<i4"), 27: np.dtype("<i8"), 28: np.dtype("<f8"), 30: BFLOAT16,
}


def map_file(path: Path) -> np.ndarray:
    """A read-only memory map of a whole file as a uint8 ndarray, advised for huge pages (as
    safetensors_io.map_file). Its base is an np.memmap, as gguf.GGUFReader's views were: views
    of it are told apart from copies by that (tests/memory_checks.py)."""
    m = np.memmap(path, dtype=np.uint8, mode="r")
    if hasattr(mmap, "MADV_HUGEPAGE") and isinstance(m.base, mmap.mmap):
        with contextlib.suppress(OSError):  # a kernel without them: 4 KB pages it is
            m.base.madvise(mmap.MADV_HUGEPAGE)
    return m.view(np.ndarray)


class _Truncated(Exception):
    """The header runs past the end of the file."""


class _Corrupt(Exception):
    """The header holds something GGUF does not allow (the message says what)."""


@dataclass(frozen=True)
class GGUFTensor:
    """One entry of the tensor table. `dims` as GGUF lists them (fastest-varying first, like
    GGUFReader's `shape`); `shape` in NumPy (row-major) order; `offset` is absolute in the file."""

    name: str
    dims: tuple[int, ...]
    tensor_type: GGMLQuantizationType
    offset: int
    n_bytes: int
    _map: np.ndarray = field(repr=False, compare=False)
    _row_bytes: int = field(repr=False, compare=False)  # bytes per row (of dims[0] elements)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64))

    @property
    def data(self) -> np.ndarray:
        """A read-only view of the file: in its dtype, of `shape`, for float and integer types
        (bfloat16 through ml_dtypes); uint8 of shape (..., bytes per row) for quantized ones,
        as GGUFReader gives it."""
        raw = self._map[self.offset:self.offset + self.n_bytes]
        dtype = _NUMPY_TYPES.get(self.tensor_type)
        if dtype is not None:
            return raw.view(dtype).reshape(self.shape)
        return raw.reshape(*self.shape[:-1], self._row_bytes)


class GGUFFile:
    """The header, metadata and tensor table of a GGUF file, and a read-only memory map of it.

    Refuses, with a ValueError "<path>: <what>", a file that is not GGUF, a big-endian or
    unsupported version, a header cut short, a corrupt header or tensor table, and tensor data
    running past the end of the file.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ValueError(f"{self.path}: not a GGUF file (it starts with {magic!r}, not "
                             f"b'GGUF')")
        self.size = self.path.stat().st_size
        self._map = map_file(self.path)
        self.metadata: dict[str, Any] = {}
        self._types: dict[str, int] = {}
        self.tensors: list[GGUFTensor] = []
        self._at = ("the header", 0)  # what is being read, from which byte (for errors)
        try:
            infos = self._read_header()
        except (_Truncated, struct.error, OverflowError):  # lengths past the end
            what, at = self._at
            raise ValueError(f"{self.path}: truncated GGUF header: {what} at byte {at} runs "
                             f"past the end of the file ({self.size} bytes; "
                             f"{INTERRUPTED[1:]}") from None
        except _Corrupt as e:
            raise ValueError(f"{self.path}: corrupt GGUF header: {e}") from None
        try:
            self._build_tensors(infos)
        except _Corrupt as e:
            raise ValueError(f"{self.path}: corrupt GGUF tensor table ({e})") from None

    # ---- header -------------------------------------------------------------------------------
    def _read_header(self) -> list[tuple[str, tuple[int, ...], int, int]]:
        buf = self._map
        _, version, n_tensors, n_kv = _HEADER.unpack_from(buf, 0)
        if version & 0xFFFF == 0 and version != 0:
            raise ValueError(f"{self.path}: a big-endian GGUF file (version field "
                             f"{version:#010x} at byte 4); sparsellm reads little-endian GGUF "
                             "only")
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"{self.path}: unsupported GGUF version {version} at byte 4 "
                             f"(sparsellm reads versions "
                             f"{' and '.join(map(str, SUPPORTED_VERSIONS))})")
        self.version = version
        off = _HEADER.size
        for i in range(n_kv):
            self._at = (f"key/value {i}", off)
            key, off = self._string(off)
            self._at = (f"key {key!r}", self._at[1])
            (kind,) = _U32.unpack_from(buf, off)
            if key in self.metadata:
                raise _Corrupt(f"duplicate key {key!r}")
            self.metadata[key], off = self._value(kind, off + 4, key)
            self._types[key] = kind
        self.alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in self.metadata:
            align = self.metadata["general.alignment"]
            if self._types["general.alignment"] != _UINT32:
                raise _Corrupt("general.alignment is not a uint32")
            if align == 0 or align & (align - 1):
                raise _Corrupt(f"general.alignment {align} is not a power of two")
            self.alignment = align
        infos = []
        for i in range(n_tensors):
            self._at = (f"tensor info {i}", off)
            name, off = self._string(off)
            self._at = (f"tensor {name}'s info", self._at[1])
            (n_dims,) = _U32.unpack_from(buf, off)
            if n_dims > MAX_DIMS:
                raise _Corrupt(f"tensor {name} has {n_dims} dimensions (at byte {off}); GGUF "
                               f"allows at most {MAX_DIMS}")
            if off + 4 + 8 * n_dims + 12 > self.size:
                raise _Truncated
            dims = np.frombuffer(buf, "<u8", n_dims, off + 4).tolist()
            off += 4 + 8 * n_dims
            kind, offset = struct.unpack_from("<IQ", buf, off)
            off += 12
            infos.append((name, tuple(dims), kind, offset))
        self.data_offset = -(-off // self.alignment) * self.alignment
        return infos

    def _string(self, off: int) -> tuple[str, int]:
        (n,) = _U64.unpack_from(self._map, off)
        start, end = off + 8, off + 8 + n
        if end > self.size:
            raise _Truncated
        return self._decode(self._map[start:end].tobytes(), start), end

    def _decode(self, raw: bytes, off: int) -> str:
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise _Corrupt(f"the string at byte {off} is not UTF-8") from None

    def _value(self, kind: int, off: int, key: str) -> tuple[Any, int]:
        """The value of type `kind` at `off`, and the offset after it."""
        scalar = _SCALARS.get(kind)
        if scalar is not None:
            return scalar[0].unpack_from(self._map, off)[0], off + scalar[0].size
        if kind == _STRING:
            return self._string(off)
        if kind == _ARRAY:
            item, count = struct.unpack_from("<IQ", self._map, off)
            return self._array(item, count, off + 12, key)
        raise _Corrupt(f"key {key!r} has unknown value type {kind}")

    def _array(self, item: int, count: int, off: int, key: str) -> tuple[list[Any], int]:
        buf, size = self._map, self.size
        scalar = _SCALARS.get(item)
        if scalar is not None:
            end = off + count * scalar[1].itemsize
            if end > size:
                raise _Truncated
            return np.frombuffer(buf, scalar[1], count, off).tolist(), end
        if item == _STRING:
            if off + 8 * count > size:  # each string takes 8 bytes at least
                raise _Truncated
            # One bytes object over the rest of the file would copy it; slices of the map copy
            # each string only. struct reads the lengths straight from the map.
            data = memoryview(buf)
            unpack = _U64.unpack_from
            out: list[Any] = [None] * count
            try:
                for i in range(count):
                    start = off + 8
                    off = start + unpack(data, off)[0]
                    out[i] = str(data[start:off], "utf-8")
            except UnicodeDecodeError:
                if off > size:  # cut short inside a character
                    raise _Truncated from None
                raise _Corrupt(f"a string of key {key!r} at byte {start} is not UTF-8") from None
            if off > size:  # a slice past the end is silently short: checked once, here
                raise _Truncated
            return out, off
        if item == _ARRAY:
            if off + 12 * count > size:
                raise _Truncated
            out = [None] * count
            for i in range(count):
                sub, n = struct.unpack_from("<IQ", buf, off)
                out[i], off = self._array(sub, n, off + 12, key)
            return out, off
        raise _Corrupt(f"key {key!r} is an array of unknown value type {item}")

    # ---- tensors ------------------------------------------------------------------------------
    def _build_tensors(self, infos: list[tuple[str, tuple[int, ...], int, int]]) -> None:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        names: set[str] = set()
        for name, dims, kind, offset in infos:
            try:
                ggml_type = GGMLQuantizationType(kind)
                block, type_size = GGML_QUANT_SIZES[ggml_type]
            except (ValueError, KeyError):
                raise _Corrupt(f"tensor {name} has unknown ggml type {kind}") from None
            if offset % self.alignment:
                raise _Corrupt(f"tensor {name}'s data offset {offset} is not a multiple of the "
                               f"alignment, {self.alignment}")
            n_elements = int(np.prod(dims, dtype=object))
            start = self.data_offset + offset
            end = start + n_elements * type_size // block
            if end > self.size:
                raise ValueError(f"{self.path}: truncated: tensor {name} ends at byte {end} but "
                                 f"the file has {self.size} bytes {INTERRUPTED}")
            if name in names:
                raise _Corrupt(f"duplicate tensor {name}")
            names.add(name)
            if dims and dims[0] % block:
                raise _Corrupt(f"tensor {name}: row size {dims[0]} is not a multiple of the "
                               f"{ggml_type.name} block size {block}")
            row_bytes = (dims[0] if dims else 1) // block * type_size
            self.tensors.append(GGUFTensor(name, dims, ggml_type, start, end - start, self._map,
                                           row_bytes))
