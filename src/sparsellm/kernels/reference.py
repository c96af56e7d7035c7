"""NumPy reference twins of the native kernels (the ground truth the tests compare against).

Packed weights are decoded from their buffers (so the packing layouts are checked too), then
`linear` is plain `x @ W.T` -- for `*_a8` formats with x first quantized to
per-token int8 and dequantized, which equals the integer dots the W8A8 kernels compute.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .. import functional as F
from ..dtypes import as_float32
from .formats import KV_SCALE_BYTES, PackedWeight


def int_weights(p: PackedWeight) -> tuple[np.ndarray, np.ndarray]:
    """Per-row int8 formats -> (q int8 (out, kp), per-row scale (out,))."""
    int_rows = p.spec.layout.int_rows
    if int_rows is None:
        raise ValueError(f"{p.format} has no per-row int8 weights")
    return int_rows(p), p.arrays["scale"][:p.shape[0]]


def dequantize(p: PackedWeight) -> np.ndarray:
    """Packed weight -> dense fp32 (out, in): what every kernel multiplies by (decoded by its
    layout, kernels/layouts.py)."""
    return np.ascontiguousarray(p.spec.layout.decode(p)[:, : p.shape[1]], dtype=np.float32)


def with_dequantized(tensors: Mapping[str, np.ndarray],
                      packed: Mapping[str, PackedWeight]) -> dict[str, np.ndarray]:
    """`tensors` with each packed weight replaced by exactly what the kernels multiply by (for
    the NumPy reference forward); weights that are packed are never read from `tensors`."""
    out = {name: as_float32(tensors[name]) for name in tensors if name not in packed}
    out.update({name: dequantize(p) for name, p in packed.items()})
    return out


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic symmetric per-token int8 on compressed-tensors' grid (twin of quantize_row):
    scale = max|x| / 127.5, xq = rint(x / scale) clamped to [-128, 127] (-max|x| is -128,
    +max|x| is 127), x ~= xq * scale[:, None]."""
    x = np.asarray(x, dtype=np.float32)
    amax = np.abs(x).max(axis=-1)
    scale = (amax / np.float32(127.5)).astype(np.float32)
    live = scale > 0  # not all zeros (nor so tiny that the scale underflows)
    safe = np.where(live, scale, np.float32(1))
    xq = np.where(live[:, None], np.clip(np.rint(x / safe[:, None]), -128, 127), 0).astype(np.int8)
    return xq, scale


def quantize_activation_groups(x: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic symmetric int8 per `group` columns (twin of the AVX-512 int8 GEMM's
    quantize_groups, weight-only int4 / int8 prefill): scale = max|x| / 127,
    xq = rint(x * (127 / max|x|)); an all-zero group (or one whose 127 / max overflows) gets
    scale 0 and codes 0. x (T, n), n a multiple of group -> (xq (T, n) int8,
    scale (T, n / group))."""
    x = np.asarray(x, dtype=np.float32)
    g = x.reshape(x.shape[0], -1, group)
    amax = np.abs(g).max(axis=-1)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.float32(127) / amax
    live = np.isfinite(inv)
    safe = np.where(live, inv, np.float32(0)).astype(np.float32)
    xq = np.rint(g * safe[..., None]).astype(np.int8).reshape(x.shape)
    return xq, np.where(live, amax / np.float32(127), np.float32(0)).astype(np.float32)


def kv_int8_rows(x: np.ndarray) -> np.ndarray:
    """Int8 KV-cache rows of x (..., hd): each vector quantized like a W8A8 activation, its
    float32 scale in the 4 bytes after its values -> int8 (..., hd + 4)."""
    x = np.asarray(x, dtype=np.float32)
    xq, scale = quantize_activations(x.reshape(-1, x.shape[-1]))
    rows = np.concatenate([xq, scale.reshape(-1, 1).view(np.int8)], axis=1)
    return rows.reshape(*x.shape[:-1], x.shape[-1] + KV_SCALE_BYTES)


def kv_dequantize(rows: np.ndarray) -> np.ndarray:
    """Int8 KV-cache rows (..., hd + 4) -> the float32 values (..., hd) attention multiplies."""
    rows = np.ascontiguousarray(rows)
    scale = rows[..., -KV_SCALE_BYTES:].copy().view(np.float32)
    return rows[..., :-KV_SCALE_BYTES].astype(np.float32) * scale


def linear(x: np.ndarray, p: PackedWeight, act_group: int = 0) -> np.ndarray:
    """Reference y = x @ W.T for x (T, in) -> (T, out) fp32. act_group > 0 (weight-only):
    x quantized per that many columns first, as the int8 GEMM does (linear_as_run)."""
    x = np.asarray(x, dtype=np.float32)
    if act_group and not p.spec.act_int8:
        cols = -(-x.shape[1] // act_group) * act_group
        xp = np.zeros((x.shape[0], cols), np.float32)
        xp[:, :x.shape[1]] = x
        xq, scale = quantize_activation_groups(xp, act_group)
        x = (xq.astype(np.float64).reshape(len(x), -1, act_group) * scale[..., None])
        x = x.reshape(len(x), cols)[:, :p.shape[1]]
    elif p.spec.act_int8:
        # The kernels' integer dots times the scales == dequantized x times dequantized W.
        xq, xscale = quantize_activations(x)
        x = xq.astype(np.float64) * xscale[:, None]
    return (x.astype(np.float64) @ dequantize(p).astype(np.float64).T).astype(np.float32)


def linear_as_run(x: np.ndarray, p: PackedWeight, prompt: bool = False,
                  dynamic_int8: bool = False) -> np.ndarray:
    """`linear` with the activations the native kernels use for this many tokens on the active
    ISA (kernels.linear with `prompt`, `dynamic_int8`): above the GEMV's limit, the integer GEMMs
    (AVX2, AVX-512) quantize a prompt's x per group of columns for the weight-only formats;
    with `dynamic_int8` on AVX2, weight-only int4's GEMV and GEMM quantize it per weight group at
    every T, weight-only int8's GEMV per 32 columns at every T but a prompt's above the GEMV's
    limit (the fp32 GEMM)."""
    native = p.native()
    gemv = len(x) <= native.gemv_max_tokens
    group = native.group_int8_act_group
    if dynamic_int8 and group > 0 and (gemv or not prompt or native.int8_gemm_act_group == group):
        return linear(x, p, act_group=group)
    gemm = prompt and not gemv
    return linear(x, p, act_group=max(native.int8_gemm_act_group, 0) if gemm else 0)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return F.rms_norm(x.astype(np.float64), weight, eps).astype(np.float32)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
               eps: float) -> np.ndarray:
    return F.layer_norm(x.astype(np.float64), weight, bias, eps).astype(np.float32)


def activation(x: np.ndarray, name: str) -> np.ndarray:
    return F.ACTIVATION_FNS[name](x.astype(np.float64)).astype(np.float32)


def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Half-split RoPE on the first 2 * len(inv_freq) dims of each head. x: (T, heads, hd)."""
    ang = positions.astype(np.float64)[:, None] * inv_freq.astype(np.float64)[None, :]
    return F.apply_rope(x, np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32))


def swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    return (F.silu(g.astype(np.float64)) * u).astype(np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slots: np.ndarray,
              positions: np.ndarray, scale: float, window: int = 0) -> np.ndarray:
    """Causal GQA. q: (T, H, hd); caches (slots, KV, cap, hd); token t of slot slots[t] at
    positions[t] attends to keys [max(0, p - window + 1), p] (window 0: all) -> (T, H, hd)."""
    T, H, hd = q.shape
    KV = k_cache.shape[1]
    out = np.zeros_like(q)
    for t in range(T):
        p = int(positions[t])
        first = max(0, p - window + 1) if window > 0 else 0
        for h in range(H):
            k = k_cache[slots[t], h // (H // KV), first: p + 1].astype(np.float64)
            v = v_cache[slots[t], h // (H // KV), first: p + 1].astype(np.float64)
            s = k @ q[t, h].astype(np.float64) * scale
            w = np.exp(s - s.max())
            out[t, h] = (w / w.sum()) @ v
    return out
