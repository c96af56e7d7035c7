"""Packed weight formats for the native linear kernels, and their NumPy packing functions.

`pack(W, "int8_a8")` quantizes a float (out, in) matrix and lays it out for streaming;
`pack_quantized(q, scale, ...)` takes exact integers (e.g. from a compressed-tensors checkpoint)
so nothing is re-quantized.
Every packed row is padded to `kp` columns (a multiple of 64 and of the int4 group) so the
kernels have no tail loops. Layouts (the C++ side documents the same in csrc/common.h and
csrc/gemv_sparse.cpp):

  fp32/fp16/bf16   data (out, kp)
  int8             data int8 (out, kp) in [-128, 127], scale (out,): w = q * scale
  int8_a8          the same values in blocks of 16 rows: data int8 (out16, kp), out16 = out
                   rounded up to 16 (zero rows); block b, columns 4j..4j+3 of its rows 0..15
                   are the 64 bytes at b * 16 * kp + 64 j, row-major (16 x 4), the order in
                   which one vpdpbusd multiplies them; scale (out16,) (zeros past out)
  int4_gG[_asym][_a8] data uint8 (out, kp/2): per 32 columns 16 bytes, byte j = q[j] | q[j+16] << 4;
                   scale (out, kp/G), zero uint8 (out, kp/G) if asym (else 8): w = (q - z) * s
  sparse_*         bitmask (out, kp/8) (bit j of byte b = column 8b+j, little bit order as
                   compressed-tensors), values = kept weights row by row, row_off (out+1,)
                   fp32/int8 values; int4: signed nibbles, those of each 64-column mask word
                   starting on a byte, row_off in bytes
  2:4_int8[_a8]    data int8 (out, kp/2): 2 values per 4 columns, meta uint64 (out, kp/64)

`_a8` formats quantize activations per token to int8 (dynamic, symmetric) and use integer dot
products; the others compute in fp32 activations.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dtypes import BFLOAT16

COL_ALIGN = 64
_VALUE_PAD = 64  # bytes after sparse values: SIMD kernels may read up to 32 bytes past the end

# C++ sl::Fmt ids (csrc/common.h)
_F32, _F16, _BF16, _I8, _I4, _SP_F32, _SP_I8, _SP_I4, _S24_I8, _I8_R16 = range(10)
ROW_BLOCK = 16  # rows per block of the int8_a8 layout
# Bumped whenever a packed layout changes: cached converted weights of an older layout are stale.
LAYOUT_VERSION = 1
KV_SCALE_BYTES = 4  # an int8 KV-cache row: head_dim values, then their float32 scale


@dataclass(frozen=True)
class FormatSpec:
    """Parsed format name."""

    name: str
    kind: str  # "fp32" | "fp16" | "bf16" | "int8" | "int4" | "sparse_fp32" | "sparse_int8" | ...
    act_int8: bool = False
    group: int = 0
    asym: bool = False


_FORMAT_RE = re.compile(
    r"^(?P<sp>sparse_|2:4_|sparse24_)?"
    r"(?:(?P<float>fp32|fp16|bf16)|int8|int4_g(?P<g>32|64|128)(?P<asym>_asym)?)(?P<a8>_a8)?$"
)

FORMATS = (
    "fp32", "fp16", "bf16", "int8", "int8_a8",
    *(f"int4_g{g}{a}{a8}" for g in (32, 64, 128) for a in ("", "_asym") for a8 in ("", "_a8")),
    "sparse_fp32", "sparse_int8", "sparse_int8_a8",
    *(f"sparse_int4_g{g}{a8}" for g in (32, 64, 128) for a8 in ("", "_a8")),
    "2:4_int8", "2:4_int8_a8",
)


def parse_format(name: str) -> FormatSpec:
    m = _FORMAT_RE.match(name)
    sp = m and m["sp"]
    if m and m["a8"] and m["float"]:
        m = None  # int8 activations only pair with integer weights
    if m and sp and (m["float"] in ("fp16", "bf16") or m["asym"]):
        m = None  # sparse values are fp32, int8 or symmetric int4
    if m and sp in ("2:4_", "sparse24_") and (m["float"] or m["g"]):
        m = None  # 2:4 kernels exist for int8 values
    if not m:
        raise ValueError(f"unknown weight format {name!r}; accepted: {', '.join(FORMATS)}")
    if m["float"]:
        base = m["float"]
    elif m["g"]:
        base = "int4"
    else:
        base = "int8"
    kind = {None: base, "sparse_": f"sparse_{base}", "2:4_": "2:4_int8",
            "sparse24_": "2:4_int8"}[sp]
    return FormatSpec(name=name, kind=kind, act_int8=bool(m["a8"]),
                      group=int(m["g"] or 0), asym=bool(m["asym"]))


def dense_twin(name: str) -> str:
    """The dense format with the same values and activations as a sparse one (the lm_head of a
    pruned model is not pruned): "sparse_int8_a8" -> "int8_a8", "2:4_int8" -> "int8"."""
    parse_format(name)
    for prefix in ("sparse24_", "sparse_", "2:4_"):
        if name.startswith(prefix):
            return name.removeprefix(prefix)
    return name


@dataclass(eq=False)
class PackedWeight:
    """A weight matrix (out, in) in one packed format: the NumPy buffers + format metadata."""

    format: str
    shape: tuple[int, int]
    kp: int
    arrays: dict[str, np.ndarray]
    _native: Any = field(default=None, repr=False)

    @property
    def spec(self) -> FormatSpec:
        return parse_format(self.format)

    @property
    def nbytes(self) -> int:
        """Bytes a GEMV streams: every buffer (values, scales, masks, offsets)."""
        return int(sum(a.nbytes for a in self.arrays.values()))

    def native(self):
        """The C++ descriptor (built once, keeps references to the buffers)."""
        if self._native is None:
            from . import _ext

            s = self.spec
            fid = {"fp32": _F32, "fp16": _F16, "bf16": _BF16, "int8": _I8, "int4": _I4,
                   "sparse_fp32": _SP_F32, "sparse_int8": _SP_I8, "sparse_int4": _SP_I4,
                   "2:4_int8": _S24_I8}[s.kind]
            if fid == _I8 and s.act_int8:
                fid = _I8_R16
            a = self.arrays
            self._native = _ext.native().NativeWeight(
                fmt=fid, rows=self.shape[0], cols=self.shape[1], kp=self.kp,
                act_int8=s.act_int8, group=s.group, asym=s.asym, data=a["data"],
                scale=a.get("scale"), zero=a.get("zero"), mask=a.get("mask"),
                row_off=a.get("row_off"), meta=a.get("meta"))
        return self._native

    def rebind(self, arrays: dict[str, np.ndarray]) -> None:
        """Use these buffers (same contents, e.g. moved into another block of memory) from now
        on; a native descriptor built over the old ones is dropped and rebuilt when needed."""
        self.arrays = arrays
        self._native = None


def packed_nbytes(shape: tuple[int, int], format: str, density: float = 1.0) -> int:
    """Bytes of a (out, in) weight packed in `format`, without packing it: exact for dense
    formats; for sparse ones, with `density` of the weights kept (the default 1.0 is an upper
    bound; pruning to 50% halves the values)."""
    s = parse_format(format)
    out, kp = shape[0], padded_cols(shape[1], s.group)
    if s.kind in ("fp32", "fp16", "bf16"):
        return out * kp * {"fp32": 4, "fp16": 2, "bf16": 2}[s.kind]
    if s.kind == "int8":
        rows = -(-out // ROW_BLOCK) * ROW_BLOCK if s.act_int8 else out
        return rows * (kp + 4)
    if s.kind == "int4":
        return out * (kp // 2 + kp // s.group * (5 if s.asym else 4))
    if s.kind == "2:4_int8":
        return out * (kp // 2 + kp // 8 + 4)
    values = math.ceil(density * {"sparse_fp32": 4 * kp, "sparse_int8": kp,
                                  "sparse_int4": kp // 2}[s.kind])
    scales = 4 * (kp // s.group if s.group else 1) if s.kind != "sparse_fp32" else 0
    return out * (values + kp // 8 + scales + 8) + _VALUE_PAD


def padded_cols(cols: int, group: int = 0) -> int:
    align = max(COL_ALIGN, group)
    return -(-cols // align) * align


def _pad(w: np.ndarray, kp: int) -> np.ndarray:
    """w zero-padded to kp columns; w itself when it already is (an fp32 matrix whose width is
    aligned packs without a copy, e.g. a tied lm_head shares the embedding table's memory)."""
    if w.shape[1] == kp and w.flags.c_contiguous:
        return w
    out = np.zeros((w.shape[0], kp), dtype=w.dtype)
    out[:, : w.shape[1]] = w
    return out


def _as_matrix(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"expected a 2-D (out, in) weight, got shape {w.shape}")
    return w.astype(np.float32, copy=False)


# Half-width float formats whose packed data is the stored bits themselves.
_STORED_AS = {"fp16": np.dtype(np.float16), "bf16": BFLOAT16}


def float_format(dtype: np.dtype) -> str:
    """The float format that runs a tensor stored as `dtype` without converting it: "bf16",
    "fp16", else "fp32" (float32, and anything that is converted to it)."""
    return next((name for name, d in _STORED_AS.items() if d == dtype), "fp32")


# ----------------------------------------------------------------------------------------------
# Quantization (float -> exact integers). Pure functions, shared with reference.py.
# ----------------------------------------------------------------------------------------------


def quantize_int8_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8: w ~= q * scale[:, None], q in [-127, 127]."""
    amax = np.maximum(w.max(axis=1), -w.min(axis=1))  # |w| without a temporary the size of w
    scale = (amax / np.float32(127)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))
    q = w / safe[:, None]  # the one float temporary; rounded and clipped in place
    np.rint(q, out=q)
    np.clip(q, -127, 127, out=q)
    return q.astype(np.int8), scale


def quantize_int4_groups(
    w: np.ndarray, group: int, asym: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Group-wise int4 of a (out, kp) matrix: q uint8 in [0, 15], w ~= (q - z) * s.

    Symmetric: z = 8, s = amax / 7. Asymmetric: the range always includes 0 (so zeros and the
    column padding stay exact), s = (max - min) / 15, z = rint(-min / s).
    """
    out, kp = w.shape
    g = w.reshape(out, kp // group, group)
    if asym:
        lo = np.minimum(g.min(axis=2), 0)
        hi = np.maximum(g.max(axis=2), 0)
        scale = ((hi - lo) / np.float32(15)).astype(np.float32)
        safe = np.where(scale > 0, scale, np.float32(1))
        zero = np.clip(np.rint(-lo / safe), 0, 15).astype(np.uint8)
        q = np.clip(np.rint(g / safe[..., None]) + zero[..., None], 0, 15)
    else:
        scale = (np.abs(g).max(axis=2) / np.float32(7)).astype(np.float32)
        safe = np.where(scale > 0, scale, np.float32(1))
        zero = None
        q = np.clip(np.rint(g / safe[..., None]), -8, 7) + 8
    return q.reshape(out, kp).astype(np.uint8), scale, zero


# ----------------------------------------------------------------------------------------------
# Layouts (exact integers -> packed buffers)
# ----------------------------------------------------------------------------------------------


def _nibbles32(q: np.ndarray) -> np.ndarray:
    """(out, kp) values 0..15 -> (out, kp/2) bytes, per 32 columns byte j = q[j] | q[j+16] << 4."""
    out, kp = q.shape
    b = q.reshape(out, kp // 32, 2, 16).astype(np.uint8)
    return (b[:, :, 0, :] | (b[:, :, 1, :] << 4)).reshape(out, kp // 2)


def _bitmask_layout(values: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Kept values row by row (+ SIMD over-read padding), bitmask and row offsets."""
    kept = values[mask]
    pad = np.zeros(_VALUE_PAD // kept.itemsize, dtype=kept.dtype)
    row_off = np.zeros(mask.shape[0] + 1, dtype=np.int64)
    np.cumsum(mask.sum(axis=1), out=row_off[1:])
    return {"data": np.concatenate([kept, pad]),
            "mask": np.packbits(mask, axis=1, bitorder="little"), "row_off": row_off}


def _nibble_stream_layout(q: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Signed int4 kept values as nibbles, per 64-column mask word, each word's nibbles
    starting on a byte (an odd count ends with an unused zero nibble); row_off in bytes."""
    out, kp = mask.shape
    cnt = mask.reshape(-1, 64).sum(axis=1)  # kept values per word, row-major
    word_off = np.zeros(cnt.size + 1, dtype=np.int64)
    np.cumsum((cnt + 1) // 2, out=word_off[1:])
    vals = (q[mask].astype(np.int16) & 15).astype(np.uint8)
    word = np.repeat(np.arange(cnt.size), cnt)
    rank = np.arange(vals.size) - (np.cumsum(cnt) - cnt)[word]
    nib = 2 * word_off[word] + rank  # global nibble index
    data = np.zeros(int(word_off[-1]) + _VALUE_PAD, dtype=np.uint8)
    even = nib % 2 == 0
    data[nib[even] // 2] = vals[even]
    data[nib[~even] // 2] |= vals[~even] << 4
    return {"data": data, "mask": np.packbits(mask, axis=1, bitorder="little"),
            "row_off": np.ascontiguousarray(word_off[:: kp // 64])}


def _row_blocks_layout(q: np.ndarray, scale: np.ndarray) -> dict[str, np.ndarray]:
    """int8 (out, kp) + scale (out,) -> the int8_a8 layout: blocks of 16 rows, each 4 columns
    of a block's rows as 16 x 4 bytes, rows zero-padded to a multiple of 16."""
    out, kp = q.shape
    out16 = -(-out // ROW_BLOCK) * ROW_BLOCK
    qp = np.zeros((out16, kp), np.int8)
    qp[:out] = q
    sp = np.zeros(out16, np.float32)
    sp[:out] = scale.reshape(out)
    data = qp.reshape(out16 // ROW_BLOCK, ROW_BLOCK, kp // 4, 4).transpose(0, 2, 1, 3)
    return {"data": data.reshape(out16, kp), "scale": sp}


def _unpack_row_blocks(data: np.ndarray, out: int) -> np.ndarray:
    """The inverse of _row_blocks_layout's data: (out, kp) int8."""
    out16, kp = data.shape
    q = data.reshape(out16 // ROW_BLOCK, kp // 4, ROW_BLOCK, 4).transpose(0, 2, 1, 3)
    return q.reshape(out16, kp)[:out]


_SLOT_CHUNK = [0, 2, 1, 3]  # 2:4 block order, see csrc/gemv_sparse.cpp


def _sparse24_layout(q: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    out, kp = q.shape
    groups = mask.reshape(out, kp // 4, 4)
    if (groups.sum(axis=2) > 2).any():
        raise ValueError("2:4 format: some group of 4 columns keeps more than 2 weights; "
                         "prune with an N:M=2:4 mask or use a 'sparse_*' format")
    # Two stored positions per group: the kept ones first, then unused positions (value 0).
    sel = np.sort(np.argsort(~groups, axis=2, kind="stable")[:, :, :2], axis=2)  # (out, kp/4, 2)
    vals = np.take_along_axis(np.where(mask, q, 0).reshape(out, kp // 4, 4), sel, axis=2)
    nb = kp // 64
    # (out, nb, chunk 4, b 8) -> slot order
    vals = vals.reshape(out, nb, 4, 8)[:, :, _SLOT_CHUNK, :]
    sel = sel.reshape(out, nb, 4, 8)[:, :, _SLOT_CHUNK, :].astype(np.uint64)
    shifts = (8 * np.arange(8)[None, :] + 2 * np.arange(4)[:, None]).astype(np.uint64)
    meta = np.bitwise_or.reduce((sel << shifts).reshape(out, nb, 32), axis=2)
    return {"data": np.ascontiguousarray(vals.reshape(out, kp // 2)).astype(np.int8),
            "meta": np.ascontiguousarray(meta, dtype=np.uint64)}


# ----------------------------------------------------------------------------------------------
# Public packing API
# ----------------------------------------------------------------------------------------------


def pack(w: np.ndarray, format: str, mask: np.ndarray | None = None) -> PackedWeight:
    """Quantize (if needed) and pack a float (out, in) weight into `format`.

    mask: (out, in) bool of kept weights for sparse formats (default: w != 0); weights outside
    the mask are dropped. Dense formats ignore zeros and accept no mask.
    """
    s = parse_format(format)
    w = np.asarray(w)
    if w.dtype == _STORED_AS.get(s.kind) and w.ndim == 2 and mask is None:
        # Already in this format (a bf16 / fp16 checkpoint): the bits as stored, no fp32 copy,
        # and no copy at all when the width is aligned (a view of a memory-mapped file stays one).
        kp = padded_cols(w.shape[1])
        return PackedWeight(format=format, shape=(w.shape[0], w.shape[1]), kp=kp,
                            arrays={"data": _pad(w.view(np.uint16), kp)})
    w = _as_matrix(w)
    out, cols = w.shape
    kp = padded_cols(cols, s.group)
    sparse = s.kind.startswith(("sparse_", "2:4_"))
    if mask is not None and not sparse:
        raise ValueError(f"format {format!r} is dense; a mask needs a sparse_* or 2:4_* format")
    if sparse:
        m = (w != 0) if mask is None else np.asarray(mask, dtype=bool)
        if m.shape != w.shape:
            raise ValueError(f"mask shape {m.shape} != weight shape {w.shape}")
        w = np.where(m, w, np.float32(0))
        mp = _pad(m, kp)
    wp = _pad(w, kp)
    arrays: dict[str, np.ndarray]
    if s.kind == "fp32":
        arrays = {"data": wp}
    elif s.kind == "fp16":
        arrays = {"data": wp.astype(np.float16).view(np.uint16)}
    elif s.kind == "bf16":
        arrays = {"data": float_to_bf16(wp)}
    elif s.kind in ("int8", "sparse_int8", "2:4_int8"):
        q, scale = quantize_int8_rows(wp)
        if s.kind == "int8":
            arrays = _row_blocks_layout(q, scale) if s.act_int8 else {"data": q, "scale": scale}
        else:
            arrays = _bitmask_layout(q, mp) if s.kind == "sparse_int8" else _sparse24_layout(q, mp)
            arrays["scale"] = scale
    elif s.kind == "int4":
        q, scale, zero = quantize_int4_groups(wp, s.group, s.asym)
        arrays = {"data": _nibbles32(q), "scale": scale.reshape(out, -1)}
        if zero is not None:
            arrays["zero"] = zero.reshape(out, -1)
    elif s.kind == "sparse_int4":
        q, scale, _ = quantize_int4_groups(wp, s.group, asym=False)
        arrays = _nibble_stream_layout(q.astype(np.int8) - 8, mp)
        arrays["scale"] = scale.reshape(out, -1)
    elif s.kind == "sparse_fp32":
        arrays = _bitmask_layout(wp, mp)
    else:  # pragma: no cover - parse_format only returns the kinds above
        raise AssertionError(s.kind)
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    return PackedWeight(format=format, shape=(out, cols), kp=kp, arrays=arrays)


def pack_quantized(
    q: np.ndarray,
    scale: np.ndarray,
    format: str,
    zero_point: np.ndarray | None = None,
    mask: np.ndarray | None = None,
) -> PackedWeight:
    """Pack exact integer weights: W = (q - zero_point) * scale (per row or per group).

    q: (out, in) integers -- int8 formats: [-128, 127]; int4: [-8, 7] symmetric, or [0, 15]
    with zero_point; scale: (out,) / (out, 1) per row, or (out, in / group) for int4;
    zero_point: (out, in / group) for `*_asym` formats; mask: kept weights for sparse formats
    (default q != 0).
    """
    s = parse_format(format)
    q = np.asarray(q)
    if q.ndim != 2:
        raise ValueError(f"expected 2-D (out, in) integers, got shape {q.shape}")
    out, cols = q.shape
    kp = padded_cols(cols, s.group)
    scale = np.asarray(scale, dtype=np.float32)
    if s.kind in ("int8", "sparse_int8", "2:4_int8"):
        if scale.size != out:
            raise ValueError(f"{format}: scale must have one value per row ({out}), got "
                             f"{scale.shape}")
        if q.min(initial=0) < -128 or q.max(initial=0) > 127:
            raise ValueError(f"{format}: q must be in [-128, 127]")
        qp = _pad(q.astype(np.int8), kp)
        if s.kind == "int8":
            if mask is not None:
                raise ValueError(f"format {format!r} is dense; a mask needs a sparse format")
            arrays = (_row_blocks_layout(qp, scale) if s.act_int8
                      else {"data": qp, "scale": scale.reshape(out).copy()})
        else:
            m = _pad((q != 0) if mask is None else np.asarray(mask, dtype=bool), kp)
            qp = np.where(m, qp, 0).astype(np.int8)
            arrays = (_bitmask_layout(qp, m) if s.kind == "sparse_int8"
                      else _sparse24_layout(qp, m))
            arrays["scale"] = scale.reshape(out).copy()
    elif s.kind in ("int4", "sparse_int4"):
        G = s.group
        if cols % G:
            raise ValueError(f"{format}: in ({cols}) must be a multiple of the group size {G}")
        if scale.shape != (out, cols // G):
            raise ValueError(f"{format}: scale must be (out, in / {G}) = {(out, cols // G)}")
        ng = kp // G
        sc = np.zeros((out, ng), np.float32)
        sc[:, : cols // G] = scale
        if s.kind == "sparse_int4":
            if q.min(initial=0) < -8 or q.max(initial=0) > 7:
                raise ValueError(f"{format}: q must be in [-8, 7]")
            m = _pad((q != 0) if mask is None else np.asarray(mask, dtype=bool), kp)
            arrays = _nibble_stream_layout(np.where(m, _pad(q.astype(np.int8), kp), 0), m)
        elif s.asym:
            if zero_point is None or np.shape(zero_point) != (out, cols // G):
                raise ValueError(f"{format}: zero_point (out, in / {G}) is required")
            if q.min(initial=0) < 0 or q.max(initial=0) > 15:
                raise ValueError(f"{format}: q must be in [0, 15]")
            zp = np.zeros((out, ng), np.uint8)
            zp[:, : cols // G] = zero_point
            # padded columns hold the zero point, i.e. the value 0
            qu = np.repeat(zp, G, axis=1)
            qu[:, :cols] = q
            arrays = {"data": _nibbles32(qu), "zero": zp}
        else:
            if q.min(initial=0) < -8 or q.max(initial=0) > 7:
                raise ValueError(f"{format}: q must be in [-8, 7]")
            arrays = {"data": _nibbles32((_pad(q.astype(np.int16), kp) + 8).astype(np.uint8))}
        arrays["scale"] = sc
    else:
        raise ValueError(f"pack_quantized takes integer formats, not {format!r}; use pack()")
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    return PackedWeight(format=format, shape=(out, cols), kp=kp, arrays=arrays)


def float_to_bf16(w: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits (uint16), round to nearest even."""
    u = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
