"""Floating-point dtypes of stored weights: float32, float16 and bfloat16 (NumPy has no bfloat16;
`ml_dtypes` provides it, so a bf16 tensor is a typed array rather than anonymous uint16 bits)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def is_float(dtype: np.dtype) -> bool:
    """A floating-point dtype, bfloat16 included (NumPy does not count it as one)."""
    return np.dtype(dtype).kind == "f" or dtype == BFLOAT16


def as_float32(arr: np.ndarray) -> np.ndarray:
    """Floats of any width -> float32 (arr itself if it already is); other dtypes unchanged."""
    return arr.astype(np.float32) if is_float(arr.dtype) and arr.dtype != np.float32 else arr
