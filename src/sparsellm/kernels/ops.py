"""NumPy-in / NumPy-out wrappers of the native kernels (the GIL is released inside)."""

from __future__ import annotations

import numpy as np

from ._ext import native
from .formats import KV_SCALE_BYTES, PackedWeight


def _f32(a: np.ndarray) -> np.ndarray:
    return np.require(a, np.float32, ["C", "A"])  # native code refuses a misaligned view


def linear(x: np.ndarray, w: PackedWeight, out: np.ndarray | None = None,
           prompt: bool = False, dynamic_int8: bool = False) -> np.ndarray:
    """y = x @ W.T. x: (T, in) or (in,) -> (T, out) or (out,). Up to a few tokens run the
    format's GEMV kernel (each packed row streamed once for all of them); more run a GEMM (see
    csrc/include/linear.h): an integer one for integer formats, which for the weight-only ones
    quantizes x per group of columns when `prompt` (a prompt chunk). `dynamic_int8`: weight-only
    int4 on AVX2 quantizes x per weight group at every T, as the engine does by default."""
    x = _f32(x)
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: x must be (T, {w.shape[1]}) for a {w.shape} weight, "
                         f"got {x.shape}")
    x2 = x.reshape(-1, w.shape[1])
    if out is None:
        out = np.empty((x2.shape[0], w.shape[0]), dtype=np.float32)
    native().linear(x2, w.native(), out.reshape(x2.shape[0], w.shape[0]), prompt, dynamic_int8)
    return out.reshape(*np.shape(x)[:-1], w.shape[0])


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2, -1) + eps) * weight over the last axis."""
    x = _f32(x)
    out = np.empty_like(x)
    native().rms_norm(x, _f32(weight), float(eps), out)
    return out


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
               eps: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * weight (+ bias) over the last axis."""
    x = _f32(x)
    out = np.empty_like(x)
    native().layer_norm(x, _f32(weight), None if bias is None else _f32(bias), float(eps), out)
    return out


def activation(x: np.ndarray, name: str) -> np.ndarray:
    """An MLP activation by name (silu, gelu_tanh, gelu, relu: the extension's `Activation`)."""
    kinds = native().Activation.__members__
    if name not in kinds:
        raise ValueError(f"unknown activation {name!r}; accepted: {', '.join(kinds)}")
    out = np.array(x, dtype=np.float32, order="C", copy=True)
    native().activation_(out, kinds[name])
    return out


def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Half-split ("rotate_half") RoPE of x (T, heads, head_dim) on the first 2 * len(inv_freq)
    dims of each head (partial RoPE when that is < head_dim); returns a new array."""
    out = np.array(x, dtype=np.float32, order="C", copy=True)
    native().rope_(out, np.ascontiguousarray(positions, dtype=np.int64),
                   np.ascontiguousarray(inv_freq, dtype=np.float64))
    return out


def swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """silu(g) * u."""
    g, u = _f32(g), _f32(u)
    out = np.empty_like(g)
    native().swiglu(g, u, out)
    return out


def add_(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x += y in place (residual add); returns x."""
    native().add_(x, _f32(y))
    return x


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    out = np.array(x, dtype=np.float32, order="C", copy=True)
    native().softmax_(out)
    return out


def attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slots: np.ndarray,
              positions: np.ndarray, scale: float, window: int | None = None,
              prompt: bool = False) -> np.ndarray:
    """Causal grouped-query attention of T query tokens over a KV cache.

    q: (T, H, hd); k_cache, v_cache: (slots, KV, capacity, hd), float32 or float16 (or int8
    rows of hd + 4, see reference.kv_int8_rows), holding
    positions 0..p of each sequence; token t (sequence slots[t], position positions[t]) attends
    to keys 0..p (the last `window` of them with a sliding window) -> (T, H, hd). prompt: the
    tokens are prompt chunks, which on AVX-512 run in blocks of consecutive queries (the same
    values up to rounding; each token's bits independent of its block).
    """
    q = _f32(q)
    out = np.empty_like(q)
    native().attention(q, k_cache, v_cache, np.ascontiguousarray(slots, dtype=np.int64),
                       np.ascontiguousarray(positions, dtype=np.int64), float(scale),
                       int(window or 0), out, bool(prompt))
    return out


def set_isa(name: str) -> None:
    """Kernel ISA: 'avx512' (AVX2 plus AVX-512 W8A8 and sparse int4 kernels), 'avx2',
    'scalar' (portable reference path) or 'auto' (best supported)."""
    native().set_isa(name)


def get_isa() -> str:
    return native().get_isa()


def set_num_threads(n: int) -> None:
    """The process default thread count (csrc/include/threads.h): what every native call without its
    own count uses (an engine's `num_cores` is its own); n <= 0 means all cores (the default)."""
    native().set_num_threads(int(n))


def get_num_threads() -> int:
    return native().get_num_threads()


def to_kv_int8(x: np.ndarray) -> np.ndarray:
    """Rows of x (n, hd) as the native int8 KV cache stores them -> int8 (n, hd + 4)."""
    x = _f32(x)
    out = np.empty((x.shape[0], x.shape[1] + KV_SCALE_BYTES), dtype=np.int8)
    native().to_kv_int8(x, out)
    return out


def to_half(x: np.ndarray) -> np.ndarray:
    """x rounded to float16 (nearest even), as the native fp16 KV cache stores it."""
    x = _f32(x)
    out = np.empty(x.shape, dtype=np.float16)
    native().to_half(x, out)
    return out
