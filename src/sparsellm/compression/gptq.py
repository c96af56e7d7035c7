"""GPTQ (Frantar et al., 2022): weight quantization with second-order error compensation.

The same column loop as SparseGPT (`obs_compress`) without pruning: each column is rounded to the
grid and its error, scaled by [H^-1]_jj, is pushed onto the columns not yet quantized.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..models.formats import QuantizedTensor, WeightFormat
from .quantize import effective_group_size
from .sparsegpt import obs_compress


def gptq_quantize(
    w: np.ndarray,
    h: np.ndarray,
    fmt: WeightFormat,
    blocksize: int = 128,
    percdamp: float = 0.01,
    actorder: bool = False,
    mask: np.ndarray | None = None,
) -> QuantizedTensor:
    """Quantize w (out, in) into `fmt` given the input Hessian h (in, in).

    mask (True = kept) preserves an existing sparsity pattern: pruned weights stay exactly zero
    and the kept ones absorb the error. Returns the exact integers and scales.
    """
    if fmt.bits not in (4, 8):
        raise ValueError(f"unsupported weight bits {fmt.bits}; supported: 4, 8")
    res = obs_compress(w, h, quant=fmt, mask=mask, blocksize=blocksize, percdamp=percdamp,
                       actorder=actorder)
    assert res.q is not None and res.scale is not None
    fmt = replace(fmt, group_size=effective_group_size(w.shape[1], fmt.group_size))
    return QuantizedTensor(q=res.q, scale=res.scale, zero_point=res.zero_point, format=fmt,
                           mask=res.mask)
