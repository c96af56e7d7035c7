"""Read and write .safetensors files with NumPy only: memory-mapped, each tensor in the dtype the
file stores (bfloat16 through `ml_dtypes`, which NumPy lacks)."""

from __future__ import annotations

import contextlib
import json
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
                raise ValueError(f"{self.path}: corrupt safetensors header: {e.msg} at byte "
                                 f"{8 + e.pos}") from None
            except UnicodeDecodeError as e:
                raise ValueError(f"{self.path}: corrupt safetensors header: not UTF-8 at byte "
                                 f"{8 + e.start}") from None
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self._data_start = 8 + header_len
        for name, info in header.items():
            if info["dtype"] not in _DTYPES:
                raise ValueError(f"{self.path}: tensor {name} has unsupported dtype "
                                 f"{info['dtype']}")
            end = self._data_start + info["data_offsets"][1]
            if end > size:
                raise ValueError(f"{self.path}: truncated: tensor {name} ends at byte {end} "
                                 f"but the file has {size} bytes {INTERRUPTED}")
        self._info = header
        # One map per file, made here (mapping reads nothing) so that threads reading tensors
        # at once all get views of this one map.
        self._map = map_file(self.path)

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

    def __contains__(self, name: object) -> bool:  # without reading (Mapping's default would)
        return name in self._info

    def __iter__(self) -> Iterator[str]:
        return iter(self._info)

    def __len__(self) -> int:
        return len(self._info)


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
