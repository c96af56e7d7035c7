"""Read and write .safetensors files with NumPy only (bf16 included, which numpy lacks)."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "U16": np.uint16, "U32": np.uint32, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items() if k not in ("BF16", "U16")}
_NAMES[np.dtype(np.uint16)] = "U16"


class SafetensorsFile(Mapping[str, np.ndarray]):
    """The tensors of one .safetensors file, each read from disk when accessed: no memory map,
    nothing cached, so weights are resident only where a caller keeps them. BF16 is widened to
    float32."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        for name, info in header.items():
            if info["dtype"] not in _DTYPES:
                raise ValueError(f"{self.path}: tensor {name} has unsupported dtype "
                                 f"{info['dtype']}")
        self._info = header
        self._data_start = 8 + header_len

    def __getitem__(self, name: str) -> np.ndarray:
        info = self._info[name]
        start, stop = info["data_offsets"]
        raw = np.fromfile(self.path, dtype=np.uint8, count=stop - start,
                          offset=self._data_start + start)
        arr = raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"])
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        return arr

    def __contains__(self, name: object) -> bool:  # without reading (Mapping's default would)
        return name in self._info

    def __iter__(self) -> Iterator[str]:
        return iter(self._info)

    def __len__(self) -> int:
        return len(self._info)


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of one file, read into memory; BF16 is widened to float32."""
    return dict(SafetensorsFile(path))


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
