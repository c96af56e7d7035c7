"""The decoder's NumPy math, shared by the reference forward (models/decoder.py) and the kernels'
NumPy twins (kernels/reference.py): norms, MLP activations, half-split RoPE, causal attention.

Ground level: it imports nothing from sparsellm, so every layer can use one definition.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

ACTIVATIONS = ("silu", "gelu_tanh", "gelu", "relu")  # the MLP activations the decoder supports


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x: (..., D) -> (..., D) (rows, or (T, heads, head_dim) for QK-norm); in fp32."""
    var = np.mean(np.square(x), axis=-1, keepdims=True)
    return x / np.sqrt(var + eps) * weight


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
               eps: float) -> np.ndarray:
    """x: (T, D) -> (T, D)."""
    mean = np.mean(x, axis=-1, keepdims=True)
    d = x - mean
    out = d / np.sqrt(np.mean(np.square(d), axis=-1, keepdims=True) + eps) * weight
    return out if bias is None else out + bias


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) = inf for x << 0: x / inf = -0, the limit
        return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) *
                                    (x + np.float32(0.044715) * x * x * x)))


def erf(x: np.ndarray) -> np.ndarray:
    """erf in float64 (Numerical Recipes' erfc, |error| < 1.2e-7: below fp32 resolution of
    GELU outputs), vectorized without SciPy."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (
        0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (
            1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    r = 1.0 - t * np.exp(poly)
    return np.where(x >= 0, r, -r)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU."""
    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(x.dtype, copy=False)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


ACTIVATION_FNS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "silu": silu, "gelu_tanh": gelu_tanh, "gelu": gelu, "relu": relu}


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Half-split RoPE on the first 2 * cos.shape[-1] dims of each head; the rest pass through.

    x: (T, heads, head_dim); cos/sin: (T, rotary_dim / 2)."""
    half = cos.shape[-1]
    if half == 0:
        return x
    x1, x2 = x[..., :half], x[..., half:2 * half]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * half:]], axis=-1)


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, scale: float,
    sliding_window: int | None = None,
) -> np.ndarray:
    """Causal grouped-query attention for n query tokens of one sequence.

    q: (n, H, hd); k, v: (KV, L, hd) holding positions 0..L-1; positions: (n,) -> (n, H, hd).
    """
    n, H, hd = q.shape
    KV, L, _ = k.shape
    g = H // KV
    qg = q.reshape(n, KV, g, hd).transpose(1, 0, 2, 3).reshape(KV, n * g, hd)
    scores = (qg @ k.transpose(0, 2, 1)) * scale  # (KV, n*g, L)
    keypos = np.arange(L)
    qpos = np.repeat(positions, g)
    masked = keypos[None, :] > qpos[:, None]
    if sliding_window:
        masked |= keypos[None, :] <= qpos[:, None] - sliding_window
    scores[:, masked] = -np.inf
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = p @ v  # (KV, n*g, hd)
    return out.reshape(KV, n, g, hd).transpose(1, 0, 2, 3).reshape(n, H, hd)
