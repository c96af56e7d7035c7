"""Declared weight formats: how each tensor of a checkpoint is stored and should be run.

A format is declared by the checkpoint (compressed-tensors `quantization_config` /
`sparsity_config` in config.json); it is never guessed from a file name. `WeightFormat` (and
its name grammar, shared with the kernels) is the ground floor's, sparsellm/weight_format.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..weight_format import Sparsity, WeightFormat

__all__ = ["DENSE_FP32", "QuantizedTensor", "Sparsity", "WeightFormat"]


DENSE_FP32 = WeightFormat()


@dataclass
class QuantizedTensor:
    """Exact integer weights as stored: W ~= (q - zero_point) * scale, per group of columns.

    q: (out, in) int8 (int4 values unpacked, in [-8, 7] or [0, 15]); scale, zero_point:
    (out, in // group_size) or (out, 1) for per-channel; mask: (out, in) bool of kept weights
    when the tensor is sparse. K-quant form (format.superblock): q in [0, 15], scale the
    superblocks' {d, dmin} (out, in / superblock, 2), zero_point their 6-bit group scale codes
    then min codes (out, in / superblock, 2 * groups): W = d * sc * q - dmin * m.
    """

    q: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None
    format: WeightFormat
    mask: np.ndarray | None = None

    def dequantize(self) -> np.ndarray:
        """-> fp32 (out, in), computed in place in one output-sized buffer (an embedding table
        is the largest tensor a model loads)."""
        out, cols = self.q.shape
        if self.format.superblock:
            codes = self.zero_point.reshape(out, self.scale.shape[1], 2, -1).astype(np.float32)
            s = self.scale[..., :1].astype(np.float32) * codes[:, :, 0]
            m = self.scale[..., 1:].astype(np.float32) * codes[:, :, 1]
            g = self.q.astype(np.float32).reshape(out, *s.shape[1:], -1)
            return (s[..., None] * g - m[..., None]).reshape(out, cols)
        groups = self.scale.shape[1]
        w = self.q.astype(np.float32)
        g = w.reshape(out, groups, cols // groups)
        if self.zero_point is not None:
            g -= self.zero_point.astype(np.float32).reshape(out, groups, 1)
        g *= self.scale.astype(np.float32).reshape(out, groups, 1)
        if self.mask is not None:
            w *= self.mask
        return w
