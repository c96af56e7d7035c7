"""Environment for tests that run `python -m sparsellm.cli` in a subprocess."""

from __future__ import annotations

import os
from pathlib import Path

import sparsellm

# The folder the tests imported sparsellm from: src/ in a development checkout run with
# PYTHONPATH=src, site-packages in CI. Children import the very same package (with its
# compiled extension) instead of a source tree that may have none.
PACKAGE_ROOT = str(Path(sparsellm.__file__).resolve().parents[1])


def subprocess_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in [PACKAGE_ROOT, os.environ.get("PYTHONPATH")] if p)
    return {**os.environ, "PYTHONPATH": path, **extra}
