"""Python face of the native CPU kernels (sparsellm._native) and their NumPy reference twins.

    w = pack(W, "sparse_int8_a8", mask)      # load time: quantize + lay out for streaming
    y = linear(x, w)                         # x (T, in) -> (T, out), GEMV for small T

Formats: `FORMATS` and `parse_format` (kernels/formats.py), each layout declared once in
kernels/layouts.py. `reference` holds the NumPy twins.
"""

from .formats import FORMATS, FormatSpec, PackedWeight, pack, pack_quantized, parse_format
from .ops import (
    activation,
    add_,
    attention,
    get_isa,
    get_num_threads,
    layer_norm,
    linear,
    rms_norm,
    rope,
    set_isa,
    set_num_threads,
    softmax,
    swiglu,
    to_half,
    to_kv_int8,
)

__all__ = [
    "FORMATS", "FormatSpec", "PackedWeight", "activation", "add_", "attention", "get_isa",
    "get_num_threads", "layer_norm", "linear", "pack", "pack_quantized", "parse_format",
    "rms_norm", "rope", "set_isa", "set_num_threads", "softmax", "swiglu", "to_half",
    "to_kv_int8",
]
