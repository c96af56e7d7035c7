"""Rotary position embedding frequencies, including the Llama 3 and linear scaling rules."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def rope_inv_freq(
    head_dim: int,
    theta: float,
    scaling: dict[str, Any] | None = None,
    freq_factors: np.ndarray | None = None,
) -> np.ndarray:
    """Inverse frequencies (head_dim/2,) in float64 (empty for head_dim 0: no RoPE).

    scaling follows HF config.json `rope_scaling` ({"rope_type": "linear" | "llama3" | "default",
    ...}); freq_factors is GGUF's `rope_freqs.weight`, which stores the llama3 rule precomputed.
    """
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if freq_factors is not None:
        return inv / np.asarray(freq_factors, dtype=np.float64)
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        smooth = (old_ctx / wavelen - low) / (high - low)
        mid = (1 - smooth) * inv / factor + smooth * inv
        out = np.where(wavelen > low_wavelen, inv / factor, inv)
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(is_mid, mid, out)
    raise ValueError(
        f"unsupported rope_scaling type {kind!r}; supported: default, linear, llama3"
    )
