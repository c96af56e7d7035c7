"""How a GGUF file's quantized tensors run: each ggml block type declares the nearest native
weight format, so a Q4_K_M file runs at 4-8 bits tensor by tensor instead of widened to fp32.

* Q4_0 (4-bit, one scale per 32 weights, no offset) is exactly int4_g32: its integers are kept.
* Q4_K (4-bit, a 6-bit scale and min per 32 weights, their scales per 256) is exactly q4_k:
  its integers and codes are kept, at its own width (4.75 bits: float32 superblock scales).
* Every other quantized type (Q8_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, Q6_K) has a per-block
  offset or more than 4 bits: it runs as int8 per output channel, requantized from the block
  values (within half an int8 step of each row's largest weight; fp32 activations, since
  per-token int8 activations cost Gemma 3 270M 4% HumanEval perplexity where the weight
  requantization costs 0.2%).

Float tensors (F32, F16, BF16) are not declared: they run in the float format they are stored in.
No file I/O: the loader passes block bytes in.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..weight_format import Q4_K
from .formats import QuantizedTensor, WeightFormat

INT8 = WeightFormat.from_name("int8")
INT4_G32 = WeightFormat.from_name("int4_g32")
# ggml type name -> the format it runs in
DECLARED = {"Q4_0": INT4_G32, "Q4_K": Q4_K, **dict.fromkeys(
    ("Q8_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "Q6_K"), INT8)}
EXACT = ("Q4_0", "Q4_K")  # the types whose integers run as stored (exact_integers)
FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED = (*FLOAT_TYPES, *DECLARED)


def check_type(type_name: str, tensor: str, path: object) -> None:
    if type_name not in SUPPORTED:
        raise ValueError(
            f"{path}: tensor {tensor!r} is stored as {type_name}, which sparsellm does not run; "
            f"supported GGUF types: {', '.join(SUPPORTED)} (re-quantize the model with "
            "llama.cpp's llama-quantize, e.g. to Q4_K_M or Q8_0)")


def q4_0_integers(blocks: np.ndarray, shape: tuple[int, int]) -> QuantizedTensor:
    """Q4_0 blocks (rows, 18 bytes per 32 weights: fp16 scale d, then 16 bytes whose low
    nibbles are weights 0..15 and high nibbles 16..31) -> exact integers: w = (q - 8) * d."""
    out, cols = shape
    b = np.asarray(blocks, dtype=np.uint8).reshape(out, cols // 32, 18)
    d = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    nib = b[..., 2:]
    q = np.concatenate([nib & 15, nib >> 4], axis=-1).astype(np.int8) - np.int8(8)
    return QuantizedTensor(q=q.reshape(out, cols), scale=d, zero_point=None, format=INT4_G32)


def q4_k_integers(blocks: np.ndarray, shape: tuple[int, int]) -> QuantizedTensor:
    """Q4_K blocks (rows, 144 bytes per 256 weights: fp16 d and dmin, 12 bytes packing 8 6-bit
    scale codes and 8 min codes, 128 bytes of nibbles: per 64 weights, 32 bytes whose low
    nibbles are weights 0..31 and high nibbles 32..63) -> exact integers q, {d, dmin} and the
    codes (sc[0..7], m[0..7]) per superblock: w = d * sc[g] * q - dmin * m[g]."""
    out, cols = shape
    b = np.asarray(blocks, dtype=np.uint8).reshape(out, cols // 256, 144)
    sb = b[..., :4].copy().view(np.float16).astype(np.float32)  # (out, nsb, 2)
    k = b[..., 4:16].astype(np.uint8)
    # groups 0..3: the low 6 bits of bytes 0..3 (scales) and 4..7 (mins); groups 4..7: the
    # nibbles of bytes 8..11, with the top 2 bits of bytes 0..3 (scales) and 4..7 (mins)
    sc = np.concatenate([k[..., 0:4] & 63, (k[..., 8:12] & 15) | ((k[..., 0:4] >> 6) << 4)], -1)
    mn = np.concatenate([k[..., 4:8] & 63, (k[..., 8:12] >> 4) | ((k[..., 4:8] >> 6) << 4)], -1)
    nib = b[..., 16:].reshape(out, cols // 256, 4, 32)
    q = np.stack([nib & 15, nib >> 4], axis=3).reshape(out, cols)
    return QuantizedTensor(q=q, scale=sb, zero_point=np.concatenate([sc, mn], axis=-1),
                           format=Q4_K)


def exact_integers(type_name: str, blocks: np.ndarray, shape: tuple[int, int]) -> QuantizedTensor:
    """The exact integers of a tensor stored as one of EXACT."""
    return (q4_0_integers if type_name == "Q4_0" else q4_k_integers)(blocks, shape)


def summary(types: list[str]) -> str:
    """One line: which stored types (ggml type names, one per tensor) run in which format."""
    parts = [f"{n} {t} tensor{'s' * (n > 1)} -> {DECLARED[t].name}"
             for t, n in sorted(Counter(types).items()) if t in DECLARED]
    return ("quantized weights run natively, tensor by tensor: " + ", ".join(parts) +
            " (int8: requantized per output channel; --weights overrides)") if parts else ""
