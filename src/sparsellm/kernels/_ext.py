"""Import of the compiled extension, with an actionable error when it is missing."""

from __future__ import annotations

import functools
import os

# OpenMP threads that wait between parallel regions sleep instead of spinning. A decode step
# runs ~150 short parallel regions; when the cores are shared with other processes (CI,
# servers, a test suite in parallel), spinning threads starve the thread everyone waits for:
# measured on a loaded 2-core machine, decode went from 0.4 tok/s (default spin) to 57 tok/s.
# On dedicated cores OMP_WAIT_POLICY=ACTIVE can be a little faster; set it before import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@functools.cache
def native():
    try:
        from sparsellm import _native
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError(
            "sparsellm._native is not built; install the package with "
            "`pip install --no-build-isolation -e .` (needs a C++17 compiler, CMake, OpenMP)"
        ) from e
    return _native
