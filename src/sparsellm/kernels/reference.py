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
from .formats import _SLOT_CHUNK, KV_SCALE_BYTES, PackedWeight, _unpack_row_blocks


def _unpack_bitmask(p: PackedWeight, values: np.ndarray) -> np.ndarray:
    """Scatter the kept values back to a dense (out, kp) matrix."""
    mask = np.unpackbits(p.arrays["mask"], axis=1, bitorder="little").astype(bool)
    dense = np.zeros(mask.shape, dtype=values.dtype)
    dense[mask] = values[: int(mask.sum())]
    return dense


def _unpack_nibble_stream(p: PackedWeight) -> np.ndarray:
    """Each 64-column mask word's kept nibbles start on a byte; a row's first word at row_off."""
    mask = np.unpackbits(p.arrays["mask"], axis=1, bitorder="little").astype(bool)
    out, kp = mask.shape
    cnt = mask.reshape(out, kp // 64, 64).sum(axis=2)
    word_bytes = (cnt + 1) // 2
    word_off = p.arrays["row_off"][:out, None] + np.cumsum(word_bytes, axis=1) - word_bytes
    counts = cnt.reshape(-1)
    rank = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    nib = 2 * np.repeat(word_off.reshape(-1), counts) + rank
    q = (p.arrays["data"][nib // 2] >> (4 * (nib % 2))) & 15
    dense = np.zeros(mask.shape, dtype=np.int8)
    dense[mask] = np.where(q >= 8, q.astype(np.int16) - 16, q).astype(np.int8)
    return dense


def _unpack_sparse24(p: PackedWeight) -> np.ndarray:
    out, kp = p.shape[0], p.kp
    nb = kp // 64
    vals = p.arrays["data"].reshape(out, nb, 4, 8)
    meta = p.arrays["meta"].reshape(out, nb, 1, 1)
    s = np.arange(4).reshape(1, 1, 4, 1).astype(np.uint64)
    b = np.arange(8).reshape(1, 1, 1, 8).astype(np.uint64)
    sel = ((meta >> (8 * b + 2 * s)) & np.uint64(3)).astype(np.int64)  # (out, nb, slot, b)
    chunk = np.array(_SLOT_CHUNK).reshape(1, 1, 4, 1)
    col = 64 * np.arange(nb).reshape(1, nb, 1, 1) + 16 * chunk + 4 * (b.astype(np.int64) // 2) + sel
    dense = np.zeros((out, kp), dtype=np.int8)
    rows = np.broadcast_to(np.arange(out).reshape(out, 1, 1, 1), col.shape)
    dense[rows.ravel(), col.ravel()] = vals.ravel()
    return dense


def int_weights(p: PackedWeight) -> tuple[np.ndarray, np.ndarray]:
    """int8-family formats -> (q int8 (out, kp), per-row scale (out,))."""
    kind, out = p.spec.kind, p.shape[0]
    if kind == "int8" and p.spec.act_int8:
        q = _unpack_row_blocks(p.arrays["data"], out)
    elif kind == "int8":
        q = p.arrays["data"]
    elif kind == "sparse_int8":
        q = _unpack_bitmask(p, p.arrays["data"])
    elif kind == "2:4_int8":
        q = _unpack_sparse24(p)
    else:
        raise ValueError(f"{p.format} has no per-row int8 weights")
    return q, p.arrays["scale"][:out]


def dequantize(p: PackedWeight) -> np.ndarray:
    """Packed weight -> dense fp32 (out, in): what every kernel multiplies by."""
    kind, a = p.spec.kind, p.arrays
    out = p.shape[0]
    if kind == "fp32":
        w = a["data"]
    elif kind == "fp16":
        w = a["data"].view(np.float16).astype(np.float32)
    elif kind == "bf16":
        w = (a["data"].astype(np.uint32) << 16).view(np.float32)
    elif kind in ("int8", "sparse_int8", "2:4_int8"):
        q, scale = int_weights(p)
        w = q.astype(np.float32) * scale[:, None]
    elif kind == "int4":
        b = a["data"].reshape(out, -1, 1, 16)
        q = np.concatenate([b & 15, b >> 4], axis=2).reshape(out, p.kp).astype(np.float32)
        G = p.spec.group
        z = a["zero"].astype(np.float32) if "zero" in a else np.float32(8)
        z = np.broadcast_to(z, a["scale"].shape)
        w = ((q.reshape(out, -1, G) - z[..., None]) * a["scale"][..., None]).reshape(out, p.kp)
    elif kind == "sparse_int4":
        q = _unpack_nibble_stream(p).astype(np.float32)
        G = p.spec.group
        w = (q.reshape(out, -1, G) * a["scale"][..., None]).reshape(out, p.kp)
    elif kind == "sparse_fp32":
        w = _unpack_bitmask(p, a["data"])
    else:  # pragma: no cover
        raise AssertionError(kind)
    return np.ascontiguousarray(w[:, : p.shape[1]], dtype=np.float32)


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


def linear(x: np.ndarray, p: PackedWeight) -> np.ndarray:
    """Reference y = x @ W.T for x (T, in) -> (T, out) fp32."""
    x = np.asarray(x, dtype=np.float32)
    if p.spec.act_int8:
        # The kernels' integer dots times the scales == dequantized x times dequantized W.
        xq, xscale = quantize_activations(x)
        x = xq.astype(np.float64) * xscale[:, None]
    return (x.astype(np.float64) @ dequantize(p).astype(np.float64).T).astype(np.float32)


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
