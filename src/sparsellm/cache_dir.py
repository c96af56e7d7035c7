"""Where sparsellm keeps what it writes for later runs (converted weights, assembled packaged
models). Ground level: imports nothing from sparsellm."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "SPARSELLM_CACHE_DIR"


def default_cache_dir() -> Path:
    """$SPARSELLM_CACHE_DIR, else $XDG_CACHE_HOME/sparsellm, else ~/.cache/sparsellm."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "sparsellm"
