"""The KV cache: a preallocated block of slots, one sequence per slot."""

from __future__ import annotations

import math
import mmap

import numpy as np

from ..kernels.formats import KV_SCALE_BYTES


class KVCache:
    """Keys and values of up to `max_sequences` sequences of at most `capacity` tokens each.

    Interface: `allocate()` a slot, `append(slot, n)` after the model wrote n positions,
    `trim(slot, length)` to roll back (speculative decoding), `free(slot)`, `nbytes`.
    The model writes k/v in place; the cache owns the lengths. An int8 cache's rows hold
    head_dim values and then their float32 scale (4 bytes; kernels.reference.kv_int8_rows).
    """

    def __init__(self, num_layers: int, max_sequences: int, num_kv_heads: int, capacity: int,
                 head_dim: int, dtype: np.dtype = np.float32):
        row = head_dim + KV_SCALE_BYTES if np.dtype(dtype) == np.int8 else head_dim
        shape = (num_layers, max_sequences, num_kv_heads, capacity, row)
        self.k = _untouched_zeros(shape, dtype)  # (layers, slots, kv_heads, capacity, row)
        self.v = _untouched_zeros(shape, dtype)  # same as k
        self.capacity = capacity
        # tokens held per slot: plain ints, read and updated between native steps, where each
        # NumPy scalar operation would find the CPU caches cold
        self.lengths = [0] * max_sequences
        self._free = list(range(max_sequences - 1, -1, -1))

    @staticmethod
    def nbytes_for(num_layers: int, max_sequences: int, num_kv_heads: int, capacity: int,
                   head_dim: int, dtype: np.dtype = np.float32) -> int:
        """What a full cache of this shape takes (keys and values), before allocating it."""
        row = head_dim + KV_SCALE_BYTES if np.dtype(dtype) == np.int8 else head_dim
        return 2 * num_layers * max_sequences * num_kv_heads * capacity * row * \
            np.dtype(dtype).itemsize

    @property
    def max_sequences(self) -> int:
        return len(self.lengths)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError(
                f"all {self.max_sequences} KV-cache slots are in use; raise max_sequences"
            )
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        assert slot not in self._free, f"slot {slot} freed twice"
        self.lengths[slot] = 0
        self._free.append(slot)

    def append(self, slot: int, n: int) -> None:
        assert self.lengths[slot] + n <= self.capacity, "cache overflow"
        self.lengths[slot] += n

    def trim(self, slot: int, length: int) -> None:
        """Forget everything after the first `length` tokens of the sequence in `slot`."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot trim slot {slot} of {self.lengths[slot]} tokens to {length}")
        self.lengths[slot] = int(length)


def _untouched_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed array whose memory becomes resident only where it is written, so a long cache
    costs memory as it fills. Anonymous mmap pages are zero until touched; transparent huge
    pages are turned off for it, or the first token of each (layer, head) would make a whole
    2 MB page resident."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    buf = mmap.mmap(-1, max(1, count * dtype.itemsize),
                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)
