"""How a GGUF file's quantized tensors run: each ggml block type declares the nearest native
weight format, so a Q4_K_M file runs in int8 tensor by tensor instead of being widened to fp32.

* Q4_0 (4-bit, one scale per 32 weights, no offset) is exactly int4_g32: its integers are kept.
* Every other quantized type (Q8_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K) has a per-block offset or more
  than 4 bits: it runs as int8 per output channel, requantized from the block values (within
  half an int8 step of each row's largest weight; fp32 activations, since per-token int8
  activations cost Gemma 3 270M 4% HumanEval perplexity where the weight requantization costs
  0.2%).

Float tensors (F32, F16, BF16) are not declared: they run in the float format they are stored in.
No file I/O: the loader passes block bytes in.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from .formats import QuantizedTensor, WeightFormat

INT8 = WeightFormat(bits=8)
INT4_G32 = WeightFormat(bits=4, group_size=32)
# ggml type name -> the format it runs in
DECLARED = {"Q4_0": INT4_G32, **dict.fromkeys(
    ("Q8_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"), INT8)}
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


def summary(types: list[str]) -> str:
    """One line: which stored types (ggml type names, one per tensor) run in which format."""
    parts = [f"{n} {t} tensor{'s' * (n > 1)} -> {DECLARED[t].name}"
             for t, n in sorted(Counter(types).items()) if t in DECLARED]
    return ("quantized weights run natively, tensor by tensor: " + ", ".join(parts) +
            " (int8: requantized per output channel; --weights overrides)") if parts else ""
