"""Round-to-nearest integer quantization of weights (pure functions).

Conventions follow compressed-tensors: integers are signed (`[-2^(b-1), 2^(b-1) - 1]`), an
asymmetric format has a signed zero point, and W ~= (q - zero_point) * scale with one scale per
output channel (`group_size=None`) or per group of `group_size` consecutive input columns.
Symmetric scales are max|w| / ((q_max - q_min) / 2) (max / 127.5 for int8, max / 7.5 for int4),
compressed-tensors' grid: the most negative weight of a group at -max maps to q_min, the most
positive one clips half a step short.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..models.formats import QuantizedTensor, WeightFormat


def qrange(bits: int) -> tuple[int, int]:
    """Signed integer range of a `bits`-wide format."""
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def compute_qparams(
    w: np.ndarray, bits: int, symmetric: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """Min-max parameters for each row of w: (rows, cols) -> scale (rows, 1) fp32, zero point
    (rows, 1) int8 or None. The range always contains 0, so a pruned (zero) weight stays zero."""
    qmin, qmax = qrange(bits)
    if symmetric:  # in float32, as compressed-tensors computes it
        amax = np.abs(np.asarray(w, dtype=np.float32)).max(axis=1, keepdims=True)
        scale = amax / np.float32((qmax - qmin) / 2)
        scale[scale == 0] = 1.0
        return scale, None
    w = np.asarray(w, dtype=np.float64)
    lo = np.minimum(w.min(axis=1, keepdims=True), 0.0)
    hi = np.maximum(w.max(axis=1, keepdims=True), 0.0)
    scale = ((hi - lo) / (qmax - qmin)).astype(np.float32)
    scale[scale == 0] = 1.0
    zp = np.clip(np.round(qmin - lo / scale.astype(np.float64)), qmin, qmax).astype(np.int8)
    return scale, zp


def quantize_values(
    w: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, bits: int
) -> np.ndarray:
    """w / scale rounded (+ zero point), clipped to the signed range -> int8 codes."""
    qmin, qmax = qrange(bits)
    q = np.round(np.asarray(w, dtype=np.float64) / scale.astype(np.float64))
    if zero_point is not None:
        q += zero_point
    return np.clip(q, qmin, qmax).astype(np.int8)


def dequantize_values(
    q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None
) -> np.ndarray:
    """Exact in float64: (q - zp) * scale, with scale already rounded to fp32."""
    q = q.astype(np.float64)
    if zero_point is not None:
        q = q - zero_point
    return q * scale.astype(np.float64)


def effective_group_size(cols: int, group_size: int | None) -> int | None:
    """Groups must tile the row; a group size that does not divide `cols` (e.g. 128 for
    SmolLM2's 576 columns) falls back to gcd(cols, group_size)."""
    if not group_size or cols % group_size == 0:
        return group_size
    return math.gcd(cols, group_size)


def rtn_quantize(
    w: np.ndarray, fmt: WeightFormat, mask: np.ndarray | None = None
) -> QuantizedTensor:
    """Round-to-nearest quantization of w (out, in) into `fmt` (bits, group_size, symmetric).

    mask: (out, in) bool of kept weights; pruned weights are zeroed before computing the
    ranges and stay exactly zero. Returns the exact integers with their scales.
    """
    if fmt.bits not in (4, 8):
        raise ValueError(f"unsupported weight bits {fmt.bits}; supported: 4, 8")
    w = np.asarray(w, dtype=np.float32)
    if mask is not None:
        w = np.where(mask, w, 0.0)
    rows, cols = w.shape
    gs = effective_group_size(cols, fmt.group_size) or cols
    groups = cols // gs
    flat = w.reshape(rows * groups, gs)
    scale, zp = compute_qparams(flat, fmt.bits, fmt.symmetric)
    q = quantize_values(flat, scale, zp, fmt.bits).reshape(rows, cols)
    return QuantizedTensor(
        q=q,
        scale=scale.reshape(rows, groups),
        zero_point=None if zp is None else zp.reshape(rows, groups),
        format=replace(fmt, group_size=gs if fmt.group_size else None),
        mask=None if mask is None else np.asarray(mask, dtype=bool),
    )


def quantize_embedding(table: np.ndarray, fmt: WeightFormat) -> QuantizedTensor:
    """An embedding table (vocab, hidden) quantized row by row: each token's vector gets its
    own scale (and zero point), which is what the lookup needs and never worse than per-tensor."""
    return rtn_quantize(table, WeightFormat(bits=fmt.bits, symmetric=fmt.symmetric))
