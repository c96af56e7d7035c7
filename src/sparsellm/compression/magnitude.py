"""Magnitude pruning (the baseline SparseGPT is measured against): pure functions."""

from __future__ import annotations

import numpy as np


def nm_mask(scores: np.ndarray, prunen: int, prunem: int) -> np.ndarray:
    """Keep mask (rows, cols) pruning the `prunen` lowest-scoring weights of every `prunem`
    consecutive weights of a row (2:4 = 2 zeros in every 4)."""
    rows, cols = scores.shape
    if not 0 < prunen < prunem:
        raise ValueError(f"N:M pruning needs 0 < N < M, got {prunen}:{prunem}")
    if cols % prunem:
        raise ValueError(f"N:M pruning needs the columns ({cols}) to be a multiple of M={prunem}")
    grouped = scores.reshape(rows, cols // prunem, prunem)
    lowest = np.argpartition(grouped, prunen - 1, axis=-1)[..., :prunen]
    pruned = np.zeros(grouped.shape, dtype=bool)
    np.put_along_axis(pruned, lowest, True, axis=-1)
    return ~pruned.reshape(rows, cols)


def magnitude_mask(w: np.ndarray, sparsity: float, prunen: int = 0, prunem: int = 0) -> np.ndarray:
    """Keep mask of the largest-|w| weights: exactly round(sparsity * size) zeros over the whole
    matrix (unstructured), or N:M per row."""
    scores = np.abs(np.asarray(w))
    if prunen:
        return nm_mask(scores, prunen, prunem)
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    k = int(round(sparsity * scores.size))
    mask = np.ones(scores.shape, dtype=bool)
    if k:
        lowest = np.argpartition(scores.ravel(), k - 1)[:k]
        mask.ravel()[lowest] = False
    return mask


def magnitude_prune(
    w: np.ndarray, sparsity: float, prunen: int = 0, prunem: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """-> (pruned weights, keep mask)."""
    mask = magnitude_mask(w, sparsity, prunen, prunem)
    return np.where(mask, w, 0).astype(np.asarray(w).dtype), mask
