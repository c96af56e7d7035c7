"""Writes that an interruption cannot leave half done."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """A file to write whose contents appear at `path` only when the block completes: a
    temporary file in the same folder, fsynced, then os.replace; an error or an interruption
    leaves no file behind (and any previous one untouched)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON to `path` atomically (`atomic_write`), so a reader never sees a half-written
    file. NumPy scalars are written as plain numbers."""
    with atomic_write(path) as f:
        json.dump(data, f, indent=2, default=_json_default)
        f.write("\n")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def check_output_dir(output_dir: str | Path, overwrite: bool) -> Path:
    """The folder to write; an existing one is refused unless `overwrite`."""
    out = Path(output_dir).expanduser()
    if out.exists() and not overwrite:
        raise ValueError(f"output folder {str(out)!r} already exists; pass overwrite=True "
                         "(--overwrite) to replace it")
    if out.exists() and not out.is_dir():
        raise ValueError(f"output folder {str(out)!r} exists and is not a folder")
    return out


@contextlib.contextmanager
def atomic_folder(output_dir: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a hidden temporary folder next to `output_dir`; when the block succeeds it is
    renamed into place (replacing an existing folder only with `overwrite`), when it fails it is
    removed. An interrupted write never leaves a half-written folder at `output_dir`."""
    out = check_output_dir(output_dir, overwrite).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.incomplete-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
