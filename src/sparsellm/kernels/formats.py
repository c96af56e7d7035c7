"""Weight formats of the native linear kernels: their names, and packing into them.

`pack(W, "int8_a8")` quantizes a float (out, in) matrix and lays it out for streaming;
`pack_quantized(q, scale, ...)` takes exact integers (e.g. from a compressed-tensors checkpoint)
so nothing is re-quantized. Every packed row is padded to `kp` columns (a multiple of 64 and of
the int4 group) so the kernels have no tail loops.

A format name is a layout (kernels/layouts.py `LAYOUTS`: the declarations, each with its
properties, packers and NumPy decoder, and `FormatSpec`) and its options, in the grammar of
sparsellm/weight_format.py (`format_name`): "sparse_int4_g32_a8" is the bitmask int4
layout with groups of 32 columns and int8 activations. `FORMATS` lists every name;
`parse_format` answers what a name means (`FormatSpec`), so code asks it and never parses names.
The functions here take a name or a `FormatSpec` (a name is parsed on the way in); inside, code
carries specs (`PackedWeight.spec`).
`_a8` formats quantize activations per token to int8 (dynamic, symmetric) and use integer dot
products; the others compute in fp32 activations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..weight_format import SPARSITY_PREFIXES, WeightFormat, format_name
from .layouts import COL_ALIGN, LAYOUTS, FormatSpec, pad_cols

__all__ = ["COL_ALIGN", "FORMATS", "FormatSpec", "PackedWeight", "as_spec", "dense_twin",
           "float_format", "pack", "pack_quantized", "packed_nbytes", "padded_cols",
           "parse_format", "spec_for"]

# Bumped whenever a packed layout changes: cached converted weights of an older layout are stale.
LAYOUT_VERSION = 1
KV_SCALE_BYTES = 4  # an int8 KV-cache row: head_dim values, then their float32 scale


def _format_specs() -> tuple[dict[str, FormatSpec], tuple[str, ...]]:
    """(every accepted name -> its spec, the names spelled with each sparsity's first prefix),
    in the order of LAYOUTS and their options (dense layouts first: a sparse spec links its
    dense twin's)."""
    specs: dict[str, FormatSpec] = {}
    names = []
    for layout in LAYOUTS:
        for group in layout.groups or (layout.group,):
            for asym in (False, True) if layout.asym else (False,):
                for act_int8 in layout.act_int8:
                    parts = (layout.values, layout.sparsity, group if layout.groups else 0,
                             asym, act_int8)
                    names.append(format_name(*parts))
                    for prefix in range(len(SPARSITY_PREFIXES[layout.sparsity])):
                        name = format_name(*parts, prefix=prefix)
                        twin = specs[format_name(parts[0], None, *parts[2:])] \
                            if layout.sparsity else None
                        specs[name] = FormatSpec(name, layout, act_int8, group, asym, twin)
    return specs, tuple(names)


# Every format name (FORMATS spells each once; "sparse24_" is accepted for "2:4_").
_SPECS, FORMATS = _format_specs()


def parse_format(name: str) -> FormatSpec:
    spec = _SPECS.get(name)
    if spec is None:
        raise ValueError(f"unknown weight format {name!r}; accepted: {', '.join(FORMATS)}")
    return spec


def as_spec(format: str | FormatSpec) -> FormatSpec:
    """A format given by name (a public argument) or already as its spec."""
    return format if isinstance(format, FormatSpec) else parse_format(format)


def spec_for(declared: WeightFormat) -> FormatSpec | None:
    """The kernel format that runs a declared format's values as they are, or None when no
    kernel does (int8 with zero points, a 4:8 mask: engine/weights.py `runnable` picks the
    nearest). The one way from a `WeightFormat` to a `FormatSpec`; `FormatSpec.declared` is
    the way back."""
    return _SPECS.get(declared.name)


def dense_twin(name: str) -> str:
    """The dense format with the same values and activations as a sparse one (the lm_head of a
    pruned model is not pruned): "sparse_int8_a8" -> "int8_a8", "2:4_int8" -> "int8"."""
    return parse_format(name).dense_twin.name


@dataclass(eq=False)
class PackedWeight:
    """A weight matrix (out, in) in one packed format: the NumPy buffers + format metadata."""

    spec: FormatSpec
    shape: tuple[int, int]
    kp: int
    arrays: dict[str, np.ndarray]
    _native: Any = field(default=None, repr=False)

    @property
    def format(self) -> str:
        """The format's name."""
        return self.spec.name

    @property
    def nbytes(self) -> int:
        """Bytes a GEMV streams: every buffer (values, scales, masks, offsets)."""
        return int(sum(a.nbytes for a in self.arrays.values()))

    def native(self):
        """The C++ descriptor (built once, keeps references to the buffers)."""
        if self._native is None:
            from . import _ext

            s = self.spec
            # Whole elements at aligned addresses: a file's bytes viewed in place can sit at any
            # address (a GGUF whose general.alignment is 1 or 2), and a kernel's load of a
            # misaligned float is undefined behaviour (UBSan: scripts/sanitize.sh). Such a
            # buffer is copied; an aligned one (every normal file) is used where it is.
            a = {k: v if v.flags.aligned else v.copy() for k, v in self.arrays.items()}
            self._native = _ext.native().NativeWeight(
                fmt=s.native_format, rows=self.shape[0], cols=self.shape[1], kp=self.kp,
                act_int8=s.act_int8, group=s.group, asym=s.asym, data=a["data"],
                scale=a.get("scale"), zero=a.get("zero"), mask=a.get("mask"),
                row_off=a.get("row_off"), meta=a.get("meta"))
        return self._native

    def rebind(self, arrays: dict[str, np.ndarray]) -> None:
        """Use these buffers (same contents, e.g. moved into another block of memory) from now
        on; a native descriptor built over the old ones is dropped and rebuilt when needed."""
        self.arrays = arrays
        self._native = None


def packed_nbytes(shape: tuple[int, int], format: str | FormatSpec, density: float = 1.0) -> int:
    """Bytes of a (out, in) weight packed in `format`, without packing it: exact for dense
    formats; for sparse ones, with `density` of the weights kept (the default 1.0 is an upper
    bound; pruning to 50% halves the values)."""
    s = as_spec(format)
    return s.layout.nbytes(shape[0], padded_cols(shape[1], s.col_align), s, density)


def padded_cols(cols: int, align: int = COL_ALIGN) -> int:
    """cols rounded up to a multiple of `align` (a FormatSpec's col_align; at least 64)."""
    align = max(COL_ALIGN, align)
    return -(-cols // align) * align


def _as_matrix(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"expected a 2-D (out, in) weight, got shape {w.shape}")
    return w.astype(np.float32, copy=False)


def float_format(dtype: np.dtype) -> FormatSpec:
    """The float format that runs a tensor stored as `dtype` without converting it: bf16,
    fp16, else fp32 (float32, and anything that is converted to it)."""
    return _SPECS[next((layout.kind for layout in LAYOUTS
                        if layout.stored_as is not None and layout.stored_as == dtype), "fp32")]


def _packed(s: FormatSpec, shape: tuple[int, int], kp: int, arrays: dict) -> PackedWeight:
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    return PackedWeight(spec=s, shape=shape, kp=kp, arrays=arrays)


def pack(w: np.ndarray, format: str | FormatSpec, mask: np.ndarray | None = None
         ) -> PackedWeight:
    """Quantize (if needed) and pack a float (out, in) weight into `format`.

    mask: (out, in) bool of kept weights for sparse formats (default: w != 0); weights outside
    the mask are dropped. Dense formats ignore zeros and accept no mask.
    """
    s = as_spec(format)
    w = np.asarray(w)
    stored_as = s.layout.stored_as  # (not compared when None: float64 == None is True in NumPy)
    if stored_as is not None and w.dtype == stored_as and w.ndim == 2 and mask is None:
        # Already in this format (a bf16 / fp16 checkpoint): the bits as stored, no fp32 copy,
        # and no copy at all when the width is aligned (a view of a memory-mapped file stays one).
        kp = padded_cols(w.shape[1])
        return PackedWeight(spec=s, shape=(w.shape[0], w.shape[1]), kp=kp,
                            arrays={"data": pad_cols(w.view(np.uint16), kp)})
    w = _as_matrix(w)
    out, cols = w.shape
    kp = padded_cols(cols, s.col_align)
    if mask is not None and not s.sparse:
        raise ValueError(f"format {s.name!r} is dense; a mask needs a sparse_* or 2:4_* format")
    mp = None
    if s.sparse:
        m = (w != 0) if mask is None else np.asarray(mask, dtype=bool)
        if m.shape != w.shape:
            raise ValueError(f"mask shape {m.shape} != weight shape {w.shape}")
        w = np.where(m, w, np.float32(0))
        mp = pad_cols(m, kp)
    return _packed(s, (out, cols), kp, s.layout.pack(pad_cols(w, kp), mp, s))


def pack_quantized(
    q: np.ndarray,
    scale: np.ndarray,
    format: str | FormatSpec,
    zero_point: np.ndarray | None = None,
    mask: np.ndarray | None = None,
) -> PackedWeight:
    """Pack exact integer weights: W = (q - zero_point) * scale (per row or per group).

    q: (out, in) integers -- int8 formats: [-128, 127]; int4: [-8, 7] symmetric, or [0, 15]
    with zero_point; scale: (out,) / (out, 1) per row, or (out, in / group) for int4;
    zero_point: (out, in / group) for `*_asym` formats; mask: kept weights for sparse formats
    (default q != 0). q4_k: q in [0, 15], scale its superblocks' {d, dmin} (out, in/256, 2),
    zero_point their 6-bit codes (out, in/256, 16), as in a GGUF Q4_K tensor.
    """
    s = as_spec(format)
    q = np.asarray(q)
    if q.ndim != 2:
        raise ValueError(f"expected 2-D (out, in) integers, got shape {q.shape}")
    if s.layout.pack_ints is None:
        raise ValueError(f"pack_quantized takes integer formats, not {s.name!r}; use pack()")
    if mask is not None and not s.sparse:
        raise ValueError(f"format {s.name!r} is dense; a mask needs a sparse format")
    out, cols = q.shape
    kp = padded_cols(cols, s.col_align)
    m = pad_cols((q != 0) if mask is None else np.asarray(mask, dtype=bool), kp) \
        if s.sparse else None
    arrays = s.layout.pack_ints(q, np.asarray(scale, dtype=np.float32), zero_point, m, s, kp)
    return _packed(s, (out, cols), kp, arrays)
