"""The converted-weights cache: packed weights written once, memory-mapped on every later load.

Converting a checkpoint to a runtime format (bf16 -> int8_a8, a pruned model -> bitmask sparse,
a compressed-tensors checkpoint -> the kernels' layouts) costs seconds to minutes at 1B-7B; the
result depends only on the source files and the formats. The first load writes the packed
buffers to one file in the cache folder; later loads map that file (page-cache speed, 2 MB pages,
shared by every process that loads the same model) instead of converting again. Like OpenVINO's
model cache and llama.cpp's quantize step, but automatic.

An entry is named by the source folder and the formats (so one model in one format has one
entry, replaced when stale), and its header records the source files' sizes and modification
times and the packing layout version: a changed source, or a new layout, makes the entry stale,
and it is rewritten. Writes are atomic (temp + rename): an interrupted write leaves no entry.

The folder is bounded, since one 7B model in three formats is 15 GB: before an entry is
written, the least recently used entries (a load touches its entry's mtime) are deleted until
the folder stays within $SPARSELLM_CACHE_MAX_GB (default 40) and the disk keeps
max(2 GB, 5%) free; when even an empty folder could not hold the entry, nothing is cached.
Leftover temp files of writes that were killed (an out-of-memory kill, say) go too.

File layout: 8 bytes "SLWCACHE", 8 bytes little-endian header length, the JSON header, zero
padding to a 4096-byte boundary, then every buffer at a 64-byte aligned offset.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..cache_dir import default_cache_dir
from ..kernels.formats import LAYOUT_VERSION, FormatSpec, PackedWeight, parse_format
from ..models.safetensors_io import map_file

logger = logging.getLogger(__name__)

MAGIC = b"SLWCACHE"
_ALIGN = 64
_DATA_ALIGN = 4096
MAX_GB_ENV = "SPARSELLM_CACHE_MAX_GB"
DEFAULT_MAX_GB = 40.0
_ORPHAN_SECONDS = 3600  # a temp file nobody wrote to for an hour is a killed write's


def cache_dir_of(setting: str | Path | bool | None) -> Path | None:
    """The `weights_cache` setting -> a folder, or None when caching is off (False / None)."""
    if setting is True:
        return default_cache_dir()
    if setting is False or setting is None:
        return None
    return Path(setting).expanduser()


class WeightCache:
    """The cache entry of one (source files, formats) pair."""

    def __init__(self, folder: Path, source_files: list[Path],
                 formats: Mapping[str, FormatSpec]):
        sources = [Path(f).resolve() for f in source_files]
        self.sources = [{"path": str(f), "size": f.stat().st_size,
                         "mtime_ns": f.stat().st_mtime_ns} for f in sources]
        self.formats = {name: spec.name for name, spec in formats.items()}  # as the header has them
        name = json.dumps([[str(f) for f in sources], sorted(self.formats.items())])
        digest = hashlib.sha256(name.encode()).hexdigest()[:20]
        label = sources[0].parent.name if sources else "model"
        self.path = folder / f"{label}-{digest}.weights"
        self.limit = max_bytes()  # a malformed setting fails here, before minutes of packing

    def _identity(self) -> dict:
        return {"layout": LAYOUT_VERSION, "sources": self.sources, "formats": self.formats}

    def load(self) -> dict[str, PackedWeight] | None:
        """The cached packed weights (views of the mapped file), or None if there is no entry
        or it is stale or unreadable (then it is rebuilt)."""
        if not self.path.is_file():
            return None
        try:
            header, data = _read(self.path)
        except (OSError, ValueError) as e:
            logger.warning("ignoring unreadable weights cache entry %s (%s)", self.path, e)
            return None
        if header.get("identity") != self._identity():
            logger.info("weights cache entry %s is stale (source or format changed)", self.path)
            return None
        try:  # the header's format names, parsed once here
            specs = {name: parse_format(w["format"]) for name, w in header["weights"].items()}
        except ValueError as e:
            logger.warning("ignoring unreadable weights cache entry %s (%s)", self.path, e)
            return None
        with contextlib.suppress(OSError):
            os.utime(self.path)  # recently used: evicted last
        return {name: PackedWeight(spec=specs[name], shape=tuple(w["shape"]), kp=w["kp"],
                                   arrays={key: _view(data, *a) for key, a in w["arrays"].items()})
                for name, w in header["weights"].items()}

    def save(self, weights: Mapping[str, PackedWeight]) -> bool:
        """Write the entry atomically, evicting least recently used entries to make room; False
        (and a warning) if there is no room for it even then."""
        entries, offset = {}, 0
        for name, w in weights.items():
            arrays = {}
            for key, a in w.arrays.items():
                arrays[key] = [a.dtype.str, list(a.shape), offset]
                offset += -(-a.nbytes // _ALIGN) * _ALIGN
            entries[name] = {"format": w.format, "shape": list(w.shape), "kp": w.kp,
                             "arrays": arrays}
        header = json.dumps({"identity": self._identity(), "weights": entries}).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not _make_room(self.path, offset + len(header) + _DATA_ALIGN, self.limit):
            return False
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.",
                                   suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + struct.pack("<Q", len(header)) + header)
                f.write(b"\0" * (-f.tell() % _DATA_ALIGN))
                start = f.tell()
                for w in weights.values():
                    for a in w.arrays.values():
                        f.write(np.ascontiguousarray(a).data)
                        f.write(b"\0" * (-(f.tell() - start) % _ALIGN))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:  # filled meanwhile
                logger.warning("not caching converted weights: %s ran out of space",
                               self.path.parent)
                return False
            raise
        return True


def max_bytes() -> int:
    """The folder's size limit: $SPARSELLM_CACHE_MAX_GB, else DEFAULT_MAX_GB."""
    text = os.environ.get(MAX_GB_ENV, "")
    try:
        gb = float(text) if text else DEFAULT_MAX_GB
    except ValueError:
        gb = -1.0
    if not gb >= 0:
        raise ValueError(f"{MAX_GB_ENV}={text!r}: expected a size in GB, such as 40")
    return int(gb * 1e9)


def _make_room(path: Path, need: int, limit: int) -> bool:
    """Delete killed writes' temp files, then least recently used entries (`path`'s own stale
    entry first) until an entry of `need` bytes fits the folder's limit and leaves the disk
    max(2 GB, 5%) free. False, evicting nothing, when it cannot fit."""
    folder, now = path.parent, time.time()
    entries = []
    for f in folder.iterdir():
        with contextlib.suppress(OSError):  # another process may delete it meanwhile
            st = f.stat()
            if f.name.startswith(".") and f.name.endswith(".tmp"):
                if now - st.st_mtime > _ORPHAN_SECONDS:
                    f.unlink()
            elif f.suffix == ".weights":
                entries.append((-1.0 if f == path else st.st_mtime, st.st_size, f))
    entries.sort(key=lambda e: e[0])
    disk = shutil.disk_usage(folder)
    floor = max(2 << 30, disk.total // 20)
    used, free = sum(e[1] for e in entries), disk.free
    if need > limit or free + used - need < floor:
        logger.warning("not caching converted weights (%.1f GB): %s has %.1f GB free, the "
                       "disk keeps %.1f GB free and the cache's limit is %.3g GB ($%s)",
                       need / 1e9, folder, free / 1e9, floor / 1e9, limit / 1e9, MAX_GB_ENV)
        return False
    for _, size, f in entries:
        if used + need <= limit and free - need >= floor:
            break
        with contextlib.suppress(OSError):
            f.unlink()
            logger.info("weights cache: removed %s (least recently used)", f.name)
        used, free = used - size, free + size
    return True


def _read(path: Path) -> tuple[dict, np.ndarray]:
    """-> (header, the data section as uint8, memory-mapped)."""
    with open(path, "rb") as f:
        head = f.read(16)
        if len(head) < 16 or head[:8] != MAGIC:
            raise ValueError("not a sparsellm weights cache file")
        (n,) = struct.unpack("<Q", head[8:])
        header = json.loads(f.read(n))
    start = -(-(16 + n) // _DATA_ALIGN) * _DATA_ALIGN
    data = map_file(path)[start:]
    for w in header["weights"].values():
        for dtype, shape, offset in w["arrays"].values():
            end = offset + int(np.prod(shape)) * np.dtype(dtype).itemsize
            if end > data.size:
                raise ValueError(f"truncated ({data.size} data bytes, a buffer ends at {end})")
    return header, data


def _view(data: np.ndarray, dtype: str, shape: list[int], offset: int) -> np.ndarray:
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return data[offset:offset + n].view(dtype).reshape(shape)
