"""Checks that a mapping of tensors computes each value at access and keeps none of them."""

from __future__ import annotations

import gc
import tracemalloc
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


def owner(a: np.ndarray) -> np.ndarray:
    """The array that owns `a`'s memory (a memory map, a decoded buffer, ...)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def nothing_kept_alive(tensors: Mapping[str, np.ndarray]) -> None:
    """Every tensor that is not a view of a file's memory map (the page cache's memory, not a
    copy) is freed with the memory that holds it once the caller drops it: no cache in
    `tensors` (or behind it) keeps the array or its owner."""
    owners = {name: owner(tensors[name]) for name in tensors}
    refs = {name: weakref.ref(a) for name, a in owners.items() if not isinstance(a, np.memmap)}
    assert refs, "every tensor is a view of a memory map: nothing to check"
    del owners
    gc.collect()
    kept = sorted(name for name, ref in refs.items() if ref() is not None)
    assert kept == [], f"kept after access: {kept}"


def traced_bytes(fn: Callable[[], Any]) -> tuple[int, int]:
    """(bytes still allocated when fn returned, holding its result; peak bytes during fn),
    counting NumPy's allocations (tracemalloc sees them)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        gc.collect()
        now, peak = tracemalloc.get_traced_memory()
        del result
    finally:
        tracemalloc.stop()
    return now - before, peak - before
