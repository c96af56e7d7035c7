"""The packed layouts of the native linear kernels, each declared once with its properties and
functions (what csrc/include/formats.h's kFmtTraits row is on the C++ side).

A `Layout` says how its values are stored (bits, float or integer, sparsity), which options its
format names take (int4 groups, zero points, int8 activations), the C++ format it runs as, and
how to pack it (from floats, from exact integers), count its bytes and decode it in NumPy (the
reference twin). kernels/formats.py derives the format names (`FORMATS`) from `LAYOUTS`.

Layouts (the C++ side documents the same in csrc/include/weight.h and
csrc/kernels/scalar/gemv_sparse.cpp); every row is padded to `kp` columns (a multiple of 64 and
of the int4 group):

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
  q4_k[_a8]        llama.cpp's Q4_K values (kp a multiple of 256): data as int4's, groups of 32
                   in superblocks of 256 columns, scale float32 (out, kp/256, 2) = {d, dmin},
                   zero uint8 (out, kp/256, 16) = the 8 groups' 6-bit scale codes sc, then
                   their min codes m: w = (d * sc) * q - dmin * m
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..dtypes import BFLOAT16
from ..weight_format import Sparsity, WeightFormat, format_name

__all__ = ["COL_ALIGN", "LAYOUTS", "FormatSpec", "Layout", "Packed", "Sparsity", "pad_cols"]

COL_ALIGN = 64  # packed rows are padded to a multiple of this many columns (at least)
ROW_BLOCK = 16  # rows per block of the int8_a8 layout
_VALUE_PAD = 64  # bytes after sparse values: SIMD kernels may read up to 32 bytes past the end

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class Layout:
    """One packed layout. Its format names are `kind` + options: `_g{G}` for each of `groups`,
    `_asym` if `asym`, `_a8` where `act_int8` allows (e.g. "sparse_int4_g32_a8")."""

    values: str  # the stored values, as a dense format spells them: "fp32", "int8", "int4"
    native_format: str  # the C++ format it runs as (csrc/include/formats.h kFmtTraits name)
    bits: int  # bits of one stored value
    is_float: bool  # float values; else integers times per-row or per-group scales
    # Floats -> arrays: (w (out, kp) fp32 zero-padded, mask (out, kp) or None, spec).
    pack: Callable[[np.ndarray, np.ndarray | None, FormatSpec], Arrays]
    nbytes: Callable[[int, int, FormatSpec, float], int]  # (out, kp, spec, density) -> bytes
    decode: Callable[[Packed], np.ndarray]  # -> the fp32 (out, kp) the kernels multiply
    # Exact integers -> arrays: (q (out, in), scale, zero_point, mask (out, kp) or None, spec,
    # kp); None for float layouts.
    pack_ints: Callable[..., Arrays] | None = None
    int_rows: Callable[[Packed], np.ndarray] | None = None  # per-row int8: q (out, kp)
    sparsity: Sparsity | None = None
    act_int8: tuple[bool, ...] = (False,)  # activations it runs with: False fp32, True int8 (_a8)
    groups: tuple[int, ...] = ()  # int4 group sizes (one scale per group of columns)
    asym: bool = False  # also with zero points
    stored_as: np.dtype | None = None  # a float dtype whose bits the data is (fp16, bf16)
    group: int = 0  # a group size it always has (not in its names)
    superblock: int = 0  # columns per superblock of quantized group scales (kp's unit)

    @property
    def kind(self) -> str:
        """"int8", "sparse_int4", "2:4_int8", ...: the name stem (`FormatSpec.kind`)."""
        return format_name(self.values, self.sparsity)


@dataclass(frozen=True)
class FormatSpec:
    """What a format name means: its layout and options (kernels/formats.py `parse_format`).
    Inward of the boundaries (public arguments, CLI flags, file headers), code carries these,
    never names: `parse_format` makes one from a name once, `name` gives the name back.

    A runnable format, where `WeightFormat` (weight_format.py) is a declared one: `declared`
    is what a checkpoint declares to run in it, kernels/formats.py `spec_for` the way back."""

    name: str  # as given: "sparse24_int8" stays so spelt (FORMATS spells it "2:4_int8")
    layout: Layout
    act_int8: bool = False  # per-token int8 activations (`_a8`)
    group: int = 0  # int4 group size (`_g{group}`; q4_k: 32), 0 for per-row scales or none
    asym: bool = False  # int4 zero points (`_asym`)
    twin: FormatSpec | None = field(default=None, repr=False, compare=False)  # see dense_twin

    @property
    def dense_twin(self) -> FormatSpec:
        """The dense format with the same values and activations (itself for a dense one):
        "sparse_int8_a8" -> "int8_a8", "2:4_int8" -> "int8"."""
        return self.twin or self

    @property
    def declared(self) -> WeightFormat | None:
        """What a checkpoint declares to run in this format (the inverse of kernels/formats.py
        `spec_for`); None for fp16 and bf16, a dtype rather than a declaration."""
        return None if self.layout.stored_as is not None else WeightFormat.from_name(self.name)

    @property
    def kind(self) -> str:
        """The layout's name stem: "fp32", "int8", "int4", "sparse_int8", "2:4_int8", ..."""
        return self.layout.kind

    @property
    def bits(self) -> int:
        """Bits of one stored weight value (32, 16, 8, 4)."""
        return self.layout.bits

    @property
    def is_float(self) -> bool:
        """Float values (fp32, fp16, bf16, sparse_fp32); else integers times scales."""
        return self.layout.is_float

    @property
    def sparsity(self) -> Sparsity | None:
        return self.layout.sparsity

    @property
    def sparse(self) -> bool:
        """Weights outside a mask are dropped (bitmask or 2:4); packing takes a mask."""
        return self.layout.sparsity is not None

    @property
    def col_align(self) -> int:
        """Packed rows are padded to a multiple of this many columns."""
        return max(COL_ALIGN, self.group, self.layout.superblock)

    @property
    def native_format(self) -> str:
        """The C++ format it runs as (csrc/include/formats.h kFmtTraits)."""
        return self.layout.native_format


class Packed(Protocol):
    """What a layout's decoder reads of a packed weight (kernels/formats.py `PackedWeight`)."""

    shape: tuple[int, int]
    kp: int
    arrays: dict[str, np.ndarray]

    @property
    def spec(self) -> FormatSpec: ...


# ----------------------------------------------------------------------------------------------
# Quantization (float -> exact integers)
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


def float_to_bf16(w: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits (uint16), round to nearest even."""
    u = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def pad_cols(w: np.ndarray, kp: int) -> np.ndarray:
    """w zero-padded to kp columns; w itself when it already is (an fp32 matrix whose width is
    aligned packs without a copy, e.g. a tied lm_head shares the embedding table's memory)."""
    if w.shape[1] == kp and w.flags.c_contiguous:
        return w
    out = np.zeros((w.shape[0], kp), dtype=w.dtype)
    out[:, : w.shape[1]] = w
    return out


# ----------------------------------------------------------------------------------------------
# Value layouts (exact integers <-> packed buffers)
# ----------------------------------------------------------------------------------------------


def _nibbles32(q: np.ndarray) -> np.ndarray:
    """(out, kp) values 0..15 -> (out, kp/2) bytes, per 32 columns byte j = q[j] | q[j+16] << 4."""
    out, kp = q.shape
    b = q.reshape(out, kp // 32, 2, 16).astype(np.uint8)
    return (b[:, :, 0, :] | (b[:, :, 1, :] << 4)).reshape(out, kp // 2)


def _bitmask_layout(values: np.ndarray, mask: np.ndarray) -> Arrays:
    """Kept values row by row (+ SIMD over-read padding), bitmask and row offsets."""
    kept = values[mask]
    pad = np.zeros(_VALUE_PAD // kept.itemsize, dtype=kept.dtype)
    row_off = np.zeros(mask.shape[0] + 1, dtype=np.int64)
    np.cumsum(mask.sum(axis=1), out=row_off[1:])
    return {"data": np.concatenate([kept, pad]),
            "mask": np.packbits(mask, axis=1, bitorder="little"), "row_off": row_off}


def _unpack_bitmask(p: Packed, values: np.ndarray) -> np.ndarray:
    """Scatter the kept values back to a dense (out, kp) matrix."""
    mask = np.unpackbits(p.arrays["mask"], axis=1, bitorder="little").astype(bool)
    dense = np.zeros(mask.shape, dtype=values.dtype)
    dense[mask] = values[: int(mask.sum())]
    return dense


def _nibble_stream_layout(q: np.ndarray, mask: np.ndarray) -> Arrays:
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


def _unpack_nibble_stream(p: Packed) -> np.ndarray:
    """Each 64-column mask word's kept nibbles start on a byte; a row's first word at row_off."""
    mask = np.unpackbits(p.arrays["mask"], axis=1, bitorder="little").astype(bool)
    out, kp = mask.shape
    cnt = mask.reshape(out, kp // 64, 64).sum(axis=2)
    word_bytes = (cnt + 1) // 2
    word_off = p.arrays["row_off"][:out, None] + np.cumsum(word_bytes, axis=1) - word_bytes
    counts = cnt.reshape(-1)
    rank = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    nib = 2 * np.repeat(word_off.reshape(-1), counts) + rank
    q = (p.arrays["data"][nib // 2] >> (4 * (nib % 2))) & 15
    dense = np.zeros(mask.shape, dtype=np.int8)
    dense[mask] = np.where(q >= 8, q.astype(np.int16) - 16, q).astype(np.int8)
    return dense


def _row_blocks_layout(q: np.ndarray, scale: np.ndarray) -> Arrays:
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


def _unpack_row_blocks(p: Packed) -> np.ndarray:
    """The inverse of _row_blocks_layout's data: (out, kp) int8."""
    out16, kp = p.arrays["data"].shape
    q = p.arrays["data"].reshape(out16 // ROW_BLOCK, kp // 4, ROW_BLOCK, 4).transpose(0, 2, 1, 3)
    return q.reshape(out16, kp)[:p.shape[0]]


_SLOT_CHUNK = [0, 2, 1, 3]  # 2:4 block order, see csrc/kernels/scalar/gemv_sparse.cpp


def _sparse24_layout(q: np.ndarray, mask: np.ndarray) -> Arrays:
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


def _unpack_sparse24(p: Packed) -> np.ndarray:
    out, kp = p.shape[0], p.kp
    nb = kp // 64
    vals = p.arrays["data"].reshape(out, nb, 4, 8)
    meta = p.arrays["meta"].reshape(out, nb, 1, 1)
    s = np.arange(4).reshape(1, 1, 4, 1).astype(np.uint64)
    b = np.arange(8).reshape(1, 1, 1, 8).astype(np.uint64)
    sel = ((meta >> (8 * b + 2 * s)) & np.uint64(3)).astype(np.int64)  # (out, nb, slot, b)
    chunk = np.array(_SLOT_CHUNK).reshape(1, 1, 4, 1)
    col = 64 * np.arange(nb).reshape(1, nb, 1, 1) + 16 * chunk + 4 * (b.astype(np.int64) // 2) + sel
    dense = np.zeros((out, kp), dtype=np.int8)
    rows = np.broadcast_to(np.arange(out).reshape(out, 1, 1, 1), col.shape)
    dense[rows.ravel(), col.ravel()] = vals.ravel()
    return dense


# ----------------------------------------------------------------------------------------------
# Float layouts
# ----------------------------------------------------------------------------------------------


def _float_nbytes(out: int, kp: int, s: FormatSpec, density: float) -> int:
    return out * kp * s.bits // 8


def _decode_fp16(p: Packed) -> np.ndarray:
    return p.arrays["data"].view(np.float16).astype(np.float32)


def _decode_bf16(p: Packed) -> np.ndarray:
    return (p.arrays["data"].astype(np.uint32) << 16).view(np.float32)


# ----------------------------------------------------------------------------------------------
# Per-row int8 layouts (dense W8A16, dense W8A8 row blocks, bitmask, 2:4): w = q * scale[row]
# ----------------------------------------------------------------------------------------------


def _int8_ints(q: np.ndarray, scale: np.ndarray, s: FormatSpec, kp: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Checked exact int8 integers -> (q padded to kp, scale (out,))."""
    out = q.shape[0]
    if scale.size != out:
        raise ValueError(f"{s.name}: scale must have one value per row ({out}), got {scale.shape}")
    if q.min(initial=0) < -128 or q.max(initial=0) > 127:
        raise ValueError(f"{s.name}: q must be in [-128, 127]")
    return pad_cols(q.astype(np.int8), kp), scale.reshape(out).copy()


def _decode_int8_rows(p: Packed) -> np.ndarray:
    q = p.spec.layout.int_rows(p)
    return q.astype(np.float32) * p.arrays["scale"][:p.shape[0], None]


def _pack_int8(wp: np.ndarray, mask: np.ndarray | None, s: FormatSpec) -> Arrays:
    q, scale = quantize_int8_rows(wp)
    return {"data": q, "scale": scale}


def _pack_int8_ints(q, scale, zero_point, mask, s, kp) -> Arrays:
    qp, scale = _int8_ints(q, scale, s, kp)
    return {"data": qp, "scale": scale}


def _pack_row_blocks(wp: np.ndarray, mask: np.ndarray | None, s: FormatSpec) -> Arrays:
    return _row_blocks_layout(*quantize_int8_rows(wp))


def _pack_row_blocks_ints(q, scale, zero_point, mask, s, kp) -> Arrays:
    return _row_blocks_layout(*_int8_ints(q, scale, s, kp))


def _int8_nbytes(out: int, kp: int, s: FormatSpec, density: float) -> int:
    return out * (kp + 4)


def _row_blocks_nbytes(out: int, kp: int, s: FormatSpec, density: float) -> int:
    return -(-out // ROW_BLOCK) * ROW_BLOCK * (kp + 4)


def _sparse_int8(layout: Callable[[np.ndarray, np.ndarray], Arrays]):
    """(pack, pack_ints) of a sparse int8 layout: kept values and mask -> `layout`, + scales."""
    def pack(wp: np.ndarray, mask: np.ndarray, s: FormatSpec) -> Arrays:
        q, scale = quantize_int8_rows(wp)
        return {**layout(q, mask), "scale": scale}

    def pack_ints(q, scale, zero_point, mask, s, kp) -> Arrays:
        qp, scale = _int8_ints(q, scale, s, kp)
        return {**layout(np.where(mask, qp, 0).astype(np.int8), mask), "scale": scale}

    return pack, pack_ints


def _s24_nbytes(out: int, kp: int, s: FormatSpec, density: float) -> int:
    return out * (kp // 2 + kp // 8 + 4)


# ----------------------------------------------------------------------------------------------
# Group-scaled int4 layouts (dense, bitmask): w = (q - z) * scale[row, group]
# ----------------------------------------------------------------------------------------------


def _int4_scales(q: np.ndarray, scale: np.ndarray, s: FormatSpec, kp: int) -> np.ndarray:
    """Checked group scales (out, in / G) -> padded to (out, kp / G)."""
    (out, cols), G = q.shape, s.group
    if cols % G:
        raise ValueError(f"{s.name}: in ({cols}) must be a multiple of the group size {G}")
    if scale.shape != (out, cols // G):
        raise ValueError(f"{s.name}: scale must be (out, in / {G}) = {(out, cols // G)}")
    sc = np.zeros((out, kp // G), np.float32)
    sc[:, : cols // G] = scale
    return sc


def _check_signed_int4(q: np.ndarray, s: FormatSpec) -> None:
    if q.min(initial=0) < -8 or q.max(initial=0) > 7:
        raise ValueError(f"{s.name}: q must be in [-8, 7]")


def _pack_int4(wp: np.ndarray, mask: np.ndarray | None, s: FormatSpec) -> Arrays:
    q, scale, zero = quantize_int4_groups(wp, s.group, s.asym)
    out = wp.shape[0]
    arrays = {"data": _nibbles32(q), "scale": scale.reshape(out, -1)}
    if zero is not None:
        arrays["zero"] = zero.reshape(out, -1)
    return arrays


def _pack_int4_ints(q, scale, zero_point, mask, s, kp) -> Arrays:
    sc = _int4_scales(q, scale, s, kp)
    (out, cols), G = q.shape, s.group
    if not s.asym:
        _check_signed_int4(q, s)
        return {"data": _nibbles32((pad_cols(q.astype(np.int16), kp) + 8).astype(np.uint8)),
                "scale": sc}
    if zero_point is None or np.shape(zero_point) != (out, cols // G):
        raise ValueError(f"{s.name}: zero_point (out, in / {G}) is required")
    if q.min(initial=0) < 0 or q.max(initial=0) > 15:
        raise ValueError(f"{s.name}: q must be in [0, 15]")
    zp = np.zeros((out, kp // G), np.uint8)
    zp[:, : cols // G] = zero_point
    # padded columns hold the zero point, i.e. the value 0
    qu = np.repeat(zp, G, axis=1)
    qu[:, :cols] = q
    return {"data": _nibbles32(qu), "zero": zp, "scale": sc}


def _int4_nbytes(out: int, kp: int, s: FormatSpec, density: float) -> int:
    return out * (kp // 2 + kp // s.group * (5 if s.asym else 4))


def _decode_int4(p: Packed) -> np.ndarray:
    a, out, G = p.arrays, p.shape[0], p.spec.group
    b = a["data"].reshape(out, -1, 1, 16)
    q = np.concatenate([b & 15, b >> 4], axis=2).reshape(out, p.kp).astype(np.float32)
    z = a["zero"].astype(np.float32) if "zero" in a else np.float32(8)
    z = np.broadcast_to(z, a["scale"].shape)
    return ((q.reshape(out, -1, G) - z[..., None]) * a["scale"][..., None]).reshape(out, p.kp)


def _pack_sparse_int4(wp: np.ndarray, mask: np.ndarray, s: FormatSpec) -> Arrays:
    q, scale, _ = quantize_int4_groups(wp, s.group, asym=False)
    return {**_nibble_stream_layout(q.astype(np.int8) - 8, mask),
            "scale": scale.reshape(wp.shape[0], -1)}


def _pack_sparse_int4_ints(q, scale, zero_point, mask, s, kp) -> Arrays:
    sc = _int4_scales(q, scale, s, kp)
    _check_signed_int4(q, s)
    return {**_nibble_stream_layout(np.where(mask, pad_cols(q.astype(np.int8), kp), 0), mask),
            "scale": sc}


def _decode_sparse_int4(p: Packed) -> np.ndarray:
    out, G = p.shape[0], p.spec.group
    q = _unpack_nibble_stream(p).astype(np.float32)
    return (q.reshape(out, -1, G) * p.arrays["scale"][..., None]).reshape(out, p.kp)


# ----------------------------------------------------------------------------------------------
# Q4_K's form: w = (d * sc) * q - dmin * m per group of 32, d and dmin per 256 columns
# ----------------------------------------------------------------------------------------------

_SUPERBLOCK = 256


def quantize_q4_k(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out, kp) floats, kp a multiple of 256 -> (q uint8 (out, kp) in [0, 15], {d, dmin}
    float32 (out, kp/256, 2), codes uint8 (out, kp/256, 16)). Each group of 32 spans its range
    from min(its minimum, 0) (so zeros and padding stay exact up to a step), and the groups'
    scales and mins are quantized to 6 bits against their superblock's largest."""
    out, kp = w.shape
    g = w.reshape(out, kp // _SUPERBLOCK, 8, 32)
    lo = np.minimum(g.min(axis=3), 0)
    scale, mins = (g.max(axis=3) - lo) / np.float32(15), -lo
    sb = np.stack([scale.max(axis=2), mins.max(axis=2)], axis=2).astype(np.float32) / 63
    safe = np.where(sb > 0, sb, np.float32(1))
    codes = np.concatenate([np.rint(scale / safe[..., :1]), np.rint(mins / safe[..., 1:])],
                           axis=2).clip(0, 63).astype(np.uint8)
    s_eff, m_eff = _q4_k_groups(sb, codes)
    inv = np.where(s_eff > 0, 1 / np.where(s_eff > 0, s_eff, 1), 0).astype(np.float32)
    q = np.clip(np.rint((g + m_eff[..., None]) * inv[..., None]), 0, 15).astype(np.uint8)
    return q.reshape(out, kp), sb, codes


def _q4_k_groups(sb: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Superblocks' {d, dmin} and codes -> each group's scale d * sc and min dmin * m, float32
    (out, kp/256, 8) (exact: an fp16 times a 6-bit code)."""
    return (sb[..., :1] * codes[..., :8].astype(np.float32),
            sb[..., 1:] * codes[..., 8:].astype(np.float32))


def _pack_q4_k(wp: np.ndarray, mask: np.ndarray | None, s: FormatSpec) -> Arrays:
    q, sb, codes = quantize_q4_k(wp)
    return {"data": _nibbles32(q), "scale": sb, "zero": codes}


def _pack_q4_k_ints(q, scale, zero_point, mask, s, kp) -> Arrays:
    """q (out, in) in [0, 15]; scale: {d, dmin} (out, in/256, 2); zero_point: the codes
    (out, in/256, 16), 6-bit scales then mins (gguf_formats.q4_k_integers)."""
    out, cols = q.shape
    nsb = cols // _SUPERBLOCK
    if cols % _SUPERBLOCK or np.shape(scale) != (out, nsb, 2) or zero_point is None or \
            np.shape(zero_point) != (out, nsb, 16):
        raise ValueError(f"{s.name}: in ({cols}) must be a multiple of {_SUPERBLOCK}, scale "
                         f"(out, in/256, 2) and zero_point (out, in/256, 16)")
    if q.min(initial=0) < 0 or q.max(initial=0) > 15 or np.max(zero_point, initial=0) > 63:
        raise ValueError(f"{s.name}: q must be in [0, 15] and the codes in [0, 63]")
    sb = np.zeros((out, kp // _SUPERBLOCK, 2), np.float32)
    codes = np.zeros((out, kp // _SUPERBLOCK, 16), np.uint8)
    sb[:, :nsb], codes[:, :nsb] = scale, zero_point
    return {"data": _nibbles32(pad_cols(np.asarray(q, np.uint8), kp)), "scale": sb,
            "zero": codes}


def _q4_k_nbytes(out: int, kp: int, s: FormatSpec, density: float) -> int:
    return out * (kp // 2 + kp // _SUPERBLOCK * (8 + 16))


def _decode_q4_k(p: Packed) -> np.ndarray:
    a, out = p.arrays, p.shape[0]
    b = a["data"].reshape(out, -1, 1, 16)
    q = np.concatenate([b & 15, b >> 4], axis=2).reshape(out, -1, 8, 32).astype(np.float32)
    s_eff, m_eff = _q4_k_groups(a["scale"], a["zero"])
    return (s_eff[..., None] * q - m_eff[..., None]).reshape(out, p.kp)


# ----------------------------------------------------------------------------------------------
# Bitmask layouts of any values
# ----------------------------------------------------------------------------------------------


def _bitmask_nbytes(out: int, kp: int, s: FormatSpec, density: float) -> int:
    values = math.ceil(density * (kp * s.bits // 8))
    scales = 0 if s.is_float else 4 * (kp // s.group if s.group else 1)
    # per row: values, mask, scales, offset; then the values' padding and the last offset
    return out * (values + kp // 8 + scales + 8) + _VALUE_PAD + 8


# ----------------------------------------------------------------------------------------------
# The declarations
# ----------------------------------------------------------------------------------------------

_GROUPS = (32, 64, 128)
_BOTH = (False, True)  # runs with fp32 activations and, as `_a8` names, with int8 ones
_pack_sparse_int8, _pack_sparse_int8_ints = _sparse_int8(_bitmask_layout)
_pack_sparse24_int8, _pack_sparse24_int8_ints = _sparse_int8(_sparse24_layout)

FP32 = Layout("fp32", native_format="F32", bits=32, is_float=True,
              pack=lambda wp, mask, s: {"data": wp}, nbytes=_float_nbytes,
              decode=lambda p: p.arrays["data"])
FP16 = Layout("fp16", native_format="F16", bits=16, is_float=True, stored_as=np.dtype(np.float16),
              pack=lambda wp, mask, s: {"data": wp.astype(np.float16).view(np.uint16)},
              nbytes=_float_nbytes, decode=_decode_fp16)
BF16 = Layout("bf16", native_format="BF16", bits=16, is_float=True, stored_as=BFLOAT16,
              pack=lambda wp, mask, s: {"data": float_to_bf16(wp)},
              nbytes=_float_nbytes, decode=_decode_bf16)
INT8 = Layout("int8", native_format="I8", bits=8, is_float=False,
              pack=_pack_int8, pack_ints=_pack_int8_ints, nbytes=_int8_nbytes,
              decode=_decode_int8_rows, int_rows=lambda p: p.arrays["data"])
INT8_ROW_BLOCKS = Layout("int8", native_format="I8_R16", bits=8, is_float=False, act_int8=(True,),
                         pack=_pack_row_blocks, pack_ints=_pack_row_blocks_ints,
                         nbytes=_row_blocks_nbytes, decode=_decode_int8_rows,
                         int_rows=_unpack_row_blocks)
INT4 = Layout("int4", native_format="I4", bits=4, is_float=False, act_int8=_BOTH, groups=_GROUPS,
              asym=True, pack=_pack_int4, pack_ints=_pack_int4_ints, nbytes=_int4_nbytes,
              decode=_decode_int4)
SPARSE_FP32 = Layout("fp32", native_format="SP_F32", bits=32, is_float=True,
                     sparsity=Sparsity.BITMASK, pack=lambda wp, mask, s: _bitmask_layout(wp, mask),
                     nbytes=_bitmask_nbytes, decode=lambda p: _unpack_bitmask(p, p.arrays["data"]))
SPARSE_INT8 = Layout("int8", native_format="SP_I8", bits=8, is_float=False,
                     sparsity=Sparsity.BITMASK, act_int8=_BOTH,
                     pack=_pack_sparse_int8, pack_ints=_pack_sparse_int8_ints,
                     nbytes=_bitmask_nbytes, decode=_decode_int8_rows,
                     int_rows=lambda p: _unpack_bitmask(p, p.arrays["data"]))
SPARSE_INT4 = Layout("int4", native_format="SP_I4", bits=4, is_float=False,
                     sparsity=Sparsity.BITMASK, act_int8=_BOTH, groups=_GROUPS,
                     pack=_pack_sparse_int4, pack_ints=_pack_sparse_int4_ints,
                     nbytes=_bitmask_nbytes, decode=_decode_sparse_int4)
SPARSE24_INT8 = Layout("int8", native_format="S24_I8", bits=8, is_float=False,
                       sparsity=Sparsity.TWO_FOUR, act_int8=_BOTH,
                       pack=_pack_sparse24_int8, pack_ints=_pack_sparse24_int8_ints,
                       nbytes=_s24_nbytes, decode=_decode_int8_rows, int_rows=_unpack_sparse24)
Q4_K = Layout("q4_k", native_format="I4K", bits=4, is_float=False, act_int8=_BOTH, group=32,
              superblock=_SUPERBLOCK, pack=_pack_q4_k, pack_ints=_pack_q4_k_ints,
              nbytes=_q4_k_nbytes, decode=_decode_q4_k)

# Every layout, in the order of FORMATS.
LAYOUTS = (FP32, FP16, BF16, INT8, INT8_ROW_BLOCKS, INT4, SPARSE_FP32, SPARSE_INT8, SPARSE_INT4,
           SPARSE24_INT8, Q4_K)
