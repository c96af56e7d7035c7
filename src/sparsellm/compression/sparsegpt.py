"""SparseGPT (Frantar & Alistarh, 2023): one-shot pruning with optimal-brain-surgeon updates,
optionally joint with quantization. Pure NumPy functions on one weight matrix and its Hessian.

For a linear layer y = W x with calibration inputs X (n, in), the layer-wise objective
||W X^T - W' X^T||^2 has Hessian H = 2 X^T X / n. Columns are processed left to right in blocks;
zeroing (or rounding) a weight is compensated by updating the not-yet-processed weights of its
row along the corresponding row of the upper Cholesky factor of H^-1. The same loop without
pruning is GPTQ (see gptq.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..models.formats import WeightFormat
from .quantize import compute_qparams, dequantize_values, effective_group_size, quantize_values


def accumulate_hessian(h: np.ndarray | None, x: np.ndarray, count: int) -> tuple[np.ndarray, int]:
    """Running H = 2 X^T X / n: add the rows of x (tokens, in) to h (in, in) float64 over `count`
    rows so far -> (new h, new count). The product runs in x's precision (float64 activations:
    float64 BLAS), the sum in float64."""
    x = np.asarray(x)
    x = x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False)
    x = x.reshape(-1, x.shape[-1])
    n = x.shape[0]
    xtx = (x.T @ x).astype(np.float64, copy=False)
    if h is None:
        return 2.0 * xtx / n, n
    total = count + n
    return h * (count / total) + 2.0 * xtx / total, total


def inverse_hessian_cholesky(h: np.ndarray, percdamp: float = 0.01) -> np.ndarray:
    """Upper Cholesky factor U of (H + damp I)^-1 (U^T U = H^-1), float64.

    Dead inputs (H_jj = 0: the input is always zero) get H_jj = 1. The dampening is
    `percdamp` x the mean diagonal; if H is still not positive definite it is raised tenfold.
    """
    h = np.array(h, dtype=np.float64)
    diag = np.diag_indices_from(h)
    dead = h[diag] == 0
    h[dead, dead] = 1.0
    damp = max(percdamp, 1e-8) * float(np.mean(h[diag]))
    # With J the index reversal and J H J = L L^T, U = J L^-1 J is upper triangular and
    # U^T U = J L^-T L^-1 J = H^-1: one Cholesky and one triangular inverse.
    rev = h[::-1, ::-1]
    for _ in range(6):
        try:
            lower = np.linalg.cholesky(rev + damp * np.eye(len(h)))
            return np.ascontiguousarray(np.linalg.inv(lower)[::-1, ::-1])
        except np.linalg.LinAlgError:
            damp *= 10.0
    raise ValueError("Hessian is not positive definite even after dampening; check the "
                     "calibration inputs (NaN/inf activations?)")


@dataclass
class ObsResult:
    """Output of `obs_compress`: the new weights (fp32, exactly the dequantized integers when
    quantizing), the keep mask, and the integers with their scales when quantizing."""

    weight: np.ndarray  # (out, in) fp32
    mask: np.ndarray | None  # (out, in) bool, True = kept; None when nothing was pruned
    q: np.ndarray | None = None  # (out, in) int8
    scale: np.ndarray | None = None  # (out, groups) fp32
    zero_point: np.ndarray | None = None  # (out, groups) int8


def obs_compress(
    w: np.ndarray,
    h: np.ndarray,
    *,
    sparsity: float = 0.0,
    prunen: int = 0,
    prunem: int = 0,
    quant: WeightFormat | None = None,
    mask: np.ndarray | None = None,
    blocksize: int = 128,
    percdamp: float = 0.01,
    actorder: bool = False,
) -> ObsResult:
    """The shared SparseGPT / GPTQ loop.

    w: (out, in); h: (in, in). Prunes `sparsity` of each block of columns adaptively (the
    weights with the lowest w^2 / [H^-1]_jj^2 among the block's columns), or `prunen` of every
    `prunem` consecutive weights of a row; or keeps a fixed `mask` (True = kept). With `quant`,
    every kept weight is rounded to the format's grid (scales from the current, already updated
    weights at each group start; per-channel scales from the whole matrix) and the rounding error
    is compensated too. `actorder` processes columns by decreasing H_jj (GPTQ act-order; group
    scales are then computed up front, "static groups").
    """
    w = np.array(w, dtype=np.float64)
    rows, cols = w.shape
    h = np.asarray(h, dtype=np.float64)
    if h.shape != (cols, cols):
        raise ValueError(f"Hessian shape {h.shape} does not match weight columns {cols}")
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    if prunen and not (0 < prunen < prunem and cols % prunem == 0):
        raise ValueError(f"N:M pruning {prunen}:{prunem} needs 0 < N < M and M dividing {cols}")
    dead = np.diag(h) == 0
    w[:, dead] = 0.0
    keep_fixed = None if mask is None else np.asarray(mask, dtype=bool).copy()
    perm = None
    if actorder:
        perm = np.argsort(-np.diag(h), kind="stable")
        w, h = w[:, perm], h[perm][:, perm]
        keep_fixed = None if keep_fixed is None else keep_fixed[:, perm]
    hinv = inverse_hessian_cholesky(h, percdamp)

    gs = None
    bits = sym = None
    scale = zp = None
    if quant is not None:
        bits, sym = quant.bits, quant.symmetric
        gs = effective_group_size(cols, quant.group_size)
        groups = cols // gs if gs else 1
        scale = np.ones((rows, groups), dtype=np.float32)
        zp = None if sym else np.zeros((rows, groups), dtype=np.int8)
        base = w if keep_fixed is None else np.where(keep_fixed, w, 0.0)
        if gs is None:
            scale[:, :1], z = compute_qparams(base, bits, sym)
            if zp is not None:
                zp[:, :1] = z
        elif perm is not None:  # static groups, in original column order
            orig = np.empty_like(base)
            orig[:, perm] = base
            for g in range(groups):
                s, z = compute_qparams(orig[:, g * gs:(g + 1) * gs], bits, sym)
                scale[:, g:g + 1] = s
                if zp is not None:
                    zp[:, g:g + 1] = z
    # Blocks hold whole N:M groups and whole quantization groups. Inside a block, columns are
    # updated rank-1 within sub-blocks of `sub` columns and by a GEMM after each sub-block; a
    # sub-block never splits an N:M group, and group starts fall on sub-block starts.
    step = max(prunem or 1, gs if (gs and perm is None) else 1)
    blocksize = max(step, blocksize // step * step)
    sub = math.gcd(16, gs) if (gs and perm is None) else 16
    if prunem and sub % prunem:
        sub = prunem
    sub = math.gcd(sub, blocksize)

    keep = np.ones((rows, cols), dtype=bool)
    qint = np.zeros((rows, cols), dtype=np.int8) if quant is not None else None
    row_ids = np.arange(rows)[:, None]
    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        count = i2 - i1
        w1 = w[:, i1:i2].copy()
        err1 = np.zeros_like(w1)
        hinv1 = hinv[i1:i2, i1:i2]
        d = np.diag(hinv1)
        if keep_fixed is not None:
            pruned1 = ~keep_fixed[:, i1:i2]
        elif sparsity > 0 and not prunen:
            score = (w1 / d) ** 2
            k = int(round(sparsity * score.size))
            pruned1 = np.zeros(score.shape, dtype=bool)
            if k:
                pruned1.ravel()[np.argpartition(score.ravel(), k - 1)[:k]] = True
        else:
            pruned1 = np.zeros(w1.shape, dtype=bool)
        for s1 in range(0, count, sub):
            s2 = min(s1 + sub, count)
            for i in range(s1, s2):
                if prunen and i % prunem == 0:
                    score = (w1[:, i:i + prunem] / d[i:i + prunem]) ** 2
                    lowest = np.argpartition(score, prunen - 1, axis=1)[:, :prunen]
                    pruned1[row_ids, i + lowest] = True
                col = w1[:, i]
                new = np.where(pruned1[:, i], 0.0, col)
                if quant is not None:
                    j = i1 + i
                    g = 0 if gs is None else (perm[j] // gs if perm is not None else j // gs)
                    if gs is not None and perm is None and j % gs == 0:
                        block = np.where(pruned1[:, i:i + gs], 0.0, w1[:, i:i + gs])
                        sc, z = compute_qparams(block, bits, sym)
                        scale[:, g:g + 1] = sc
                        if zp is not None:
                            zp[:, g:g + 1] = z
                    sc = scale[:, g:g + 1]
                    z = None if zp is None else zp[:, g:g + 1]
                    qi = quantize_values(new[:, None], sc, z, bits)
                    if z is not None:  # pruned weights must decode to exactly zero
                        qi = np.where(pruned1[:, i:i + 1], z, qi)
                    qint[:, j] = qi[:, 0]
                    new = dequantize_values(qi, sc, z)[:, 0]
                e = (col - new) / d[i]
                # rank-1 update inside the sub-block only; the rest of the block gets one GEMM
                w1[:, i + 1:s2] -= np.outer(e, hinv1[i, i + 1:s2])
                w1[:, i] = new
                err1[:, i] = e
            if s2 < count:
                w1[:, s2:] -= err1[:, s1:s2] @ hinv1[s1:s2, s2:]
        w[:, i1:i2] = w1
        keep[:, i1:i2] = ~pruned1
        if i2 < cols:
            w[:, i2:] -= err1 @ hinv[i1:i2, i2:]

    if perm is not None:
        inv = np.argsort(perm)
        w, keep = w[:, inv], keep[:, inv]
        qint = None if qint is None else qint[:, inv]
    pruned_any = sparsity > 0 or prunen or keep_fixed is not None
    return ObsResult(
        weight=w.astype(np.float32),
        mask=keep if pruned_any else None,
        q=qint,
        scale=scale,
        zero_point=zp,
    )


def sparsegpt_prune(
    w: np.ndarray,
    h: np.ndarray,
    sparsity: float,
    prunen: int = 0,
    prunem: int = 0,
    blocksize: int = 128,
    percdamp: float = 0.01,
    quantizer: WeightFormat | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """SparseGPT: prune w (out, in) to `sparsity` (or N:M: `prunen` zeros in every `prunem`)
    given the Hessian h = 2 X^T X / n of its inputs -> (new weights fp32, keep mask).

    With `quantizer` (a WeightFormat), kept weights are jointly quantized and the returned
    weights are the dequantized values; use `obs_compress` to get the integers as well.
    """
    res = obs_compress(w, h, sparsity=sparsity, prunen=prunen, prunem=prunem, quant=quantizer,
                       blocksize=blocksize, percdamp=percdamp)
    assert res.mask is not None or not (sparsity or prunen)
    mask = res.mask if res.mask is not None else np.ones(res.weight.shape, dtype=bool)
    return res.weight, mask
