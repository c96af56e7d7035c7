"""Will the model fit? Checked before any weight is packed, so that a model too large for this
machine is a clear error naming what it needs and what would fit, never an out-of-memory kill
half-way through loading."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..kernels.formats import FormatSpec, float_format, packed_nbytes, parse_format
from ..kernels.layouts import Sparsity
from ..models import Checkpoint
from ..models.decoder import EMBEDDING, linear_weight_shape
from .weights import embedding_format

_HEADROOM = 512 << 20  # run-state buffers, the Python process, a tensor being converted
# What to suggest, smallest first: formats that run everywhere and keep quality.
_SMALLER = ("int8_a8", "int4_g32_a8")


class ModelTooLargeError(MemoryError):
    """The model, packed as asked, needs more memory than this machine has available."""


def available_memory() -> int | None:
    """Bytes that can still be made resident: MemAvailable (free + reclaimable page cache),
    capped by a cgroup v2 memory limit; None where neither can be read."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            found.append(int(limit) - used)
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def resident_weight_bytes(checkpoint: Checkpoint, formats: dict[str, FormatSpec]) -> int:
    """Bytes of the weights once packed: every linear weight in its format (a tied lm_head in
    the table's own format shares it), the embedding table as stored, the norms."""
    args = checkpoint.args
    emb_format = embedding_format(checkpoint, formats) or \
        float_format(checkpoint.stored_dtype(EMBEDDING))
    total = packed_nbytes((args.vocab_size, args.hidden_size), emb_format)
    for name, fmt in formats.items():
        tied = name == "lm_head.weight" and name not in checkpoint.tensors
        if not (tied and fmt == emb_format):
            bitmask = fmt.sparsity is Sparsity.BITMASK  # its bytes follow density
            density = _density(checkpoint, name) if bitmask else 1.0
            total += packed_nbytes(linear_weight_shape(args, name), fmt, density)
    return total + 8 * args.num_hidden_layers * args.hidden_size * 4


def _density(checkpoint: Checkpoint, name: str, rows: int = 64) -> float:
    """Share of nonzero weights in a block of `rows` rows from the middle of a weight of a
    safetensors folder (a view of the mapped file: one contiguous read of a few hundred KB; pruning
    is spread evenly over rows), plus a 2% margin; 1.0 (the upper bound) where reading would mean
    decoding a whole tensor (quantized or compressed storage, GGUF)."""
    if checkpoint.format != "safetensors" or name in checkpoint.quantized or \
            name in checkpoint.weight_formats or name not in checkpoint.tensors:
        return 1.0
    t = checkpoint.stored[name]
    start = max(0, t.shape[0] // 2 - rows // 2)
    sample = np.asarray(t[start:start + rows])
    return min(1.0, np.count_nonzero(sample) / max(sample.size, 1) + 0.02)


def check_fits(checkpoint: Checkpoint, formats: dict[str, FormatSpec], kv_cache_bytes: int,
               backend: str = "native") -> None:
    """Raise ModelTooLargeError if the packed weights plus a full KV cache cannot fit in the
    memory available now (the NumPy reference backend holds every weight in fp32)."""
    available = available_memory()
    if available is None:
        return
    if backend == "native":
        weights = resident_weight_bytes(checkpoint, formats)
    else:
        weights = resident_weight_bytes(checkpoint, dict.fromkeys(formats, parse_format("fp32")))
    need = weights + kv_cache_bytes + _HEADROOM
    if need <= available:
        return
    gb = 1e9
    fits = [f"weights={f!r} ({resident_weight_bytes(checkpoint, _all(formats, f)) / gb:.1f} GB)"
            for f in _SMALLER]
    used = ", ".join(sorted({f.name for f in formats.values()}))
    raise ModelTooLargeError(
        f"{checkpoint.path}: this model needs about {need / gb:.1f} GB of memory "
        f"({weights / gb:.1f} GB of weights as {used}, {kv_cache_bytes / gb:.1f} GB of KV cache) "
        f"but {available / gb:.1f} GB is available. Use a smaller weight format "
        f"({', '.join(fits)}), a shorter sequence_length or batch_size, "
        "kv_cache_dtype='int8', or free memory.")


def _all(formats: dict[str, FormatSpec], name: str) -> dict[str, FormatSpec]:
    spec = parse_format(name)
    return {n: spec.dense_twin if n == "lm_head.weight" else spec for n in formats}
