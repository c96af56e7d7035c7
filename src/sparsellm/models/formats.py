"""Declared weight formats: how each tensor of a checkpoint is stored and should be run.

A format is declared by the checkpoint (compressed-tensors `quantization_config` /
`sparsity_config` in config.json); it is never guessed from a file name. `WeightFormat.name` is
the native kernel format that runs it (see `sparsellm.kernels.FORMATS`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WeightFormat:
    bits: int = 32  # 32 = float; 8 or 4 = integer weights
    group_size: int | None = None  # None = one scale per output channel
    symmetric: bool = True  # False = a zero point per group/channel
    activation_bits: int | None = None  # 8 = dynamic per-token int8 activations (W8A8)
    sparsity: str | None = None  # None | "unstructured" | "2:4"
    superblock: int | None = None  # 256: llama.cpp's K-quant form (group scales and mins in
    # 6 bits per superblock of columns), only as Q4_K ("q4_k")

    @property
    def name(self) -> str:
        base = "fp32" if self.bits == 32 else f"int{self.bits}"
        if self.superblock:
            base = f"q{self.bits}_k"
        elif self.group_size:
            base += f"_g{self.group_size}"
        if self.bits < 32 and not self.symmetric and not self.superblock:
            base += "_asym"
        if self.activation_bits:
            base += f"_a{self.activation_bits}"
        return f"sparse_{base}" if self.sparsity == "unstructured" else \
            f"{self.sparsity}_{base}" if self.sparsity else base


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
