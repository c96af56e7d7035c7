"""Import of the compiled extension, with an actionable error when it is missing."""

from __future__ import annotations

import functools


@functools.cache
def native():
    try:
        from sparsellm import _native
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError(
            "sparsellm._native is not built; install the package with "
            "`pip install --no-build-isolation -e .` (needs a C++17 compiler and CMake)"
        ) from e
    return _native
