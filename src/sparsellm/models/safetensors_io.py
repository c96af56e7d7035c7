"""Read and write .safetensors files with NumPy only: memory-mapped, each tensor in the dtype the
file stores (bfloat16 through `ml_dtypes`, which NumPy lacks)."""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from ..dtypes import BFLOAT16

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": BFLOAT16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "U16": np.uint16, "U32": np.uint32, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}
INTERRUPTED = "(an interrupted download or copy?)"  # what a file cut short usually is


def map_file(path: Path) -> np.ndarray:
    """A read-only memory map of a whole file as uint8, advised for huge pages: the kernel then
    maps the page cache in 2 MB pages where it can, so a decode step streaming weights from the
    map walks 512x fewer page-table entries than with 4 KB pages."""
    with open(path, "rb") as f:
        region = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # a kernel without them: 4 KB pages it is
            region.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(region, dtype=np.uint8)


class SafetensorsFile(Mapping[str, np.ndarray]):
    """The tensors of one .safetensors file as read-only views of a memory map of it, in the
    dtype the file stores: nothing is read until a tensor's pages are touched, the pages are the
    page cache's (shared by every process that maps the file), and nothing is copied unless a
    caller converts. A file shorter than its header says is refused when opened."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(8)
            header_len = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < header_len <= size - 8:
                raise ValueError(f"{self.path}: not a safetensors file (header length "
                                 f"{header_len} for a file of {size} bytes)")
            try:
                header = json.loads(f.read(header_len))
            except json.JSONDecodeError as e:
                raise ValueError(f"{self.path}: corrupt safetensors header: {e.msg} (at byte "
                                 f"{8 + e.pos})") from None
            except UnicodeDecodeError as e:
                raise ValueError(f"{self.path}: corrupt safetensors header: not UTF-8 at byte "
                                 f"{8 + e.start}") from None
        self._data_start = 8 + header_len
        self.metadata: dict[str, str] = self._check_header(header, size)
        self._info = header
        # One map per file, made here (mapping reads nothing) so that threads reading tensors
        # at once all get views of this one map.
        self._map = map_file(self.path)

    def _check_header(self, header: object, size: int) -> dict[str, str]:
        """Refuse a header that is not what safetensors writes (a mapping of tensor names to
        dtype, shape and data_offsets, and string metadata), or whose tensors lie outside the
        file or disagree with their shape and dtype; -> the metadata."""
        where = f"{self.path}: corrupt safetensors header"
        if not isinstance(header, dict):
            raise ValueError(f"{where}: a JSON {type(header).__name__}, not a mapping of tensor "
                             "names (at byte 8)")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError(f"{where}: __metadata__ must map strings to strings, got "
                             f"{_short(metadata)} (at byte 8)")
        for name, info in header.items():
            if not (isinstance(info, dict) and {"dtype", "shape", "data_offsets"} <= set(info)):
                raise ValueError(f"{where}: tensor {name} is {_short(info)}, not a mapping "
                                 "with dtype, shape and data_offsets")
            dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
            if not isinstance(dtype, str) or dtype not in _DTYPES:
                raise ValueError(f"{self.path}: tensor {name} has unsupported dtype "
                                 f"{_short(dtype)}; supported: {', '.join(_DTYPES)}")
            if not (isinstance(shape, list) and all(_is_count(d) for d in shape)):
                raise ValueError(f"{where}: tensor {name} has shape {_short(shape)}, not a list "
                                 "of non-negative integers")
            if not (isinstance(offsets, list) and len(offsets) == 2 and
                    all(_is_count(o) for o in offsets) and offsets[0] <= offsets[1]):
                raise ValueError(f"{where}: tensor {name} has data_offsets {_short(offsets)}, "
                                 "not [begin, end] with 0 <= begin <= end")
            end = self._data_start + offsets[1]
            if end > size:
                raise ValueError(f"{self.path}: truncated: tensor {name} ends at byte {end} "
                                 f"but the file has {size} bytes {INTERRUPTED}")
            nbytes = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
            if offsets[1] - offsets[0] != nbytes:
                raise ValueError(
                    f"{where}: tensor {name} spans bytes {self._data_start + offsets[0]} to "
                    f"{end} ({offsets[1] - offsets[0]} bytes), but {dtype} of shape "
                    f"{tuple(shape)} takes {nbytes}")
        return metadata

    def __getitem__(self, name: str) -> np.ndarray:
        start, stop = self._span(name)
        return self._typed(name, self._map[start:stop])

    def read(self, name: str) -> np.ndarray:
        """A private copy of a tensor, read from the file (through the page cache, not mapped
        into this process: converting a whole model tensor by tensor this way does not leave
        the file's pages counted in its resident memory)."""
        start, stop = self._span(name)
        return self._typed(name, np.fromfile(self.path, np.uint8, stop - start, offset=start))

    def _span(self, name: str) -> tuple[int, int]:
        """Byte range of a tensor in the file."""
        start, stop = self._info[name]["data_offsets"]
        return self._data_start + start, self._data_start + stop

    def _typed(self, name: str, raw: np.ndarray) -> np.ndarray:
        info = self._info[name]
        return raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"])

    def dtype(self, name: str) -> np.dtype:
        """The stored dtype of a tensor (from the header: nothing read)."""
        return np.dtype(_DTYPES[self._info[name]["dtype"]])

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of a tensor (from the header: nothing read)."""
        return tuple(self._info[name]["shape"])

    def __contains__(self, name: object) -> bool:  # without reading (Mapping's default would)
        return name in self._info

    def __iter__(self) -> Iterator[str]:
        return iter(self._info)

    def __len__(self) -> int:
        return len(self._info)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _short(value: object) -> str:
    """repr(value), cut to a readable length (a damaged header can hold anything)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of one file, copied into memory in its stored dtype."""
    return {name: np.array(t) for name, t in SafetensorsFile(path).items()}


def write_safetensors(
    path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> None:
    """Write atomically (temp file + rename), 8-byte aligned like the reference implementation."""
    path = Path(path)
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    arrays = []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        if arr.dtype not in _NAMES:
            raise ValueError(f"cannot store tensor {name} of dtype {arr.dtype} in safetensors")
        header[name] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        arrays.append(arr)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for arr in arrays:
            f.write(arr.tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
