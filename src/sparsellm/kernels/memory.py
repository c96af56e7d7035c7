"""One huge-page block for a model's packed weights.

A decode step streams every packed weight once, ~200 buffers of 0.1-1 MB each. Allocated one by
one they sit on 4 KB pages, and the step misses the TLB on nearly every page it reads (70 MB
of SmolLM2-135M at 50% W4A8 are 17,000 pages; the TLB covers about 12 MB). `gather` copies them
into one anonymous mapping advised for transparent huge pages (2 MB pages), in the order the
forward reads them. Measured in one process, alternating rounds: decode of the 50% W8A8 model
1.18x, 50% W4A8 1.11x, dense W8A8 1.09x, fp32 1.00x (its big buffers already got huge pages).

Where the kernel offers no transparent huge pages (or only `never`), the block is an ordinary
mapping: same results, and still one sequential stream.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
from collections.abc import Iterable

import numpy as np

from .formats import PackedWeight

_HUGE_PAGE = 2 << 20
_ALIGN = 64  # every buffer starts on a cache line
_TRIM_EVERY = 8 << 20  # bytes copied between two trims of the heap
try:  # glibc keeps freed blocks below the heap's top resident until trimmed
    _malloc_trim = ctypes.CDLL(None).malloc_trim
except (OSError, AttributeError):  # another libc
    _malloc_trim = None


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def gather(weights: Iterable[PackedWeight]) -> None:
    """Move the buffers of `weights` (in this order) into one huge-page block, in place: each
    PackedWeight's arrays become views of the block with the same contents, and the old
    buffers are freed as they are copied (unless referenced elsewhere), so peak memory grows
    by little; native descriptors built over the old buffers are dropped (`rebind`)."""
    weights = list(weights)
    total = sum(_aligned(a.nbytes) for w in weights for a in w.arrays.values())
    if total == 0:
        return
    # Anonymous mappings start on a 4 KB page; over-allocate to start the block on a 2 MB one.
    # Private: shared anonymous memory is shmem, which gets no transparent huge pages.
    private = {"flags": mmap.MAP_PRIVATE} if hasattr(mmap, "MAP_PRIVATE") else {}
    region = mmap.mmap(-1, total + _HUGE_PAGE, **private)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # a kernel without them: 4 KB pages it is
            region.madvise(mmap.MADV_HUGEPAGE)
    raw = np.frombuffer(region, dtype=np.uint8)
    start = -raw.ctypes.data % _HUGE_PAGE
    block = raw[start:start + total]
    used = trimmed = 0
    for w in weights:
        moved = {}
        for key, arr in w.arrays.items():
            moved[key] = block[used:used + arr.nbytes].view(arr.dtype).reshape(arr.shape)
            moved[key][...] = arr
            used += _aligned(arr.nbytes)
        w.rebind(moved)
        if used - trimmed >= _TRIM_EVERY:
            release_freed_heap()
            trimmed = used
    release_freed_heap()


def release_freed_heap() -> None:
    """Hand the pages of freed buffers back to the OS now, so the old buffers and their copies
    are not both resident (+70 MB at the end for SmolLM2 at 50% W4A8, without it)."""
    if _malloc_trim is not None:
        _malloc_trim(0)
