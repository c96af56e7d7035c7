"""Which packed format each linear weight runs in, decided once when an engine is built: a
`FormatSpec` per weight (the user's `weights=` name parsed once, a declared `WeightFormat`
converted by `spec_for`), carried as specs from here on."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from functools import partial

import numpy as np

from ..kernels import FORMATS, FormatSpec, PackedWeight, get_isa, pack, parse_format
from ..kernels.formats import float_format, pack_quantized, spec_for
from ..kernels.layouts import FP32
from ..kernels.reference import with_dequantized
from ..models import Checkpoint
from ..models.decoder import EMBEDDING
from ..models.formats import Sparsity, WeightFormat
from ..models.lazy import LazyTensors

logger = logging.getLogger(__name__)


def weight_formats(checkpoint: Checkpoint, weights: str | None = None
                   ) -> dict[str, FormatSpec]:
    """-> {linear weight name: format}.

    `weights`, when given, converts every linear weight on load (a sparse format keeps the zeros
    of a pruned checkpoint; the never-pruned lm_head gets its dense twin). Otherwise each weight
    runs in the format its checkpoint declares (`checkpoint.weight_formats`; a tied lm_head
    follows the embedding's; bitmask int4 without AVX-512 runs dense, `dense_on_this_cpu`),
    else in the float format it is stored in (bf16 or fp16 checkpoints stay bf16 or fp16,
    never widened; everything else fp32).
    """
    names = checkpoint.linear_weight_names
    if weights is not None:
        if weights not in FORMATS:
            raise ValueError(f"unknown weights format {weights!r}; accepted: {', '.join(FORMATS)}")
        spec = parse_format(weights)
        formats = dict.fromkeys(names, spec)
        if "lm_head.weight" in formats:
            formats["lm_head.weight"] = spec.dense_twin
        return formats
    formats = {}
    declared_formats = _declared(checkpoint)
    for name in names:
        declared = declared_formats.get(name)
        if declared is None:
            formats[name] = float_format(checkpoint.stored_dtype(_stored_as(checkpoint, name)))
            continue
        nearest = runnable(declared)
        formats[name] = spec_for(nearest)
        if formats[name] is None:  # an unsupported declared format fails here, by name
            files = checkpoint.source_files
            raise ValueError(f"{files[0] if len(files) == 1 else checkpoint.path}: tensor "
                             f"{name} is declared {nearest.name}, which the kernels do not run "
                             f"(they run: {', '.join(FORMATS)})")
    dense = {name: s.dense_twin for name, s in formats.items() if dense_on_this_cpu(s)}
    if dense:
        logger.info("%d bitmask int4 weights run as %s: dense int4 is faster on this CPU (%s); "
                    "weights=%r keeps them sparse", len(dense), ", ".join(sorted({
                        s.name for s in dense.values()})), get_isa(),
                    formats[next(iter(dense))].name)
    return formats | dense


def dense_on_this_cpu(s: FormatSpec) -> bool:
    """Whether a checkpoint's bitmask int4 weights run as their dense twin (the same integers,
    the pruned ones stored as zeros): on CPUs without AVX-512 (VBMI2's vpexpandb) the AVX2
    bitmask int4 GEMVs unpack each row's nibbles to bytes and expand them through table
    shuffles, at a third of the dense int4 GEMV's speed per token, which the 20% fewer bytes do
    not repay (kernels/bench.py at SmolLM2 shapes, 2 threads, Zen 3: 19-26 ms/token W4A16 g32
    bitmask, 8.7-8.8 dense; W4A8 18-19 and 6.9-8.6). Their prompts run level with dense int4
    (the same byte GEMM). The dense twin holds 25% more weight bytes."""
    return s.sparsity is Sparsity.BITMASK and s.bits == 4 and get_isa() != "avx512"


def declared_packed(checkpoint: Checkpoint, formats: Mapping[str, FormatSpec]
                    ) -> dict[str, PackedWeight]:
    """{name: packed exact integers} for the weights that run in the format the checkpoint
    declares and stores integers for, or its dense twin (the others are packed from their float
    values)."""
    packed = {}
    declared = _declared(checkpoint)
    for name, fmt in formats.items():
        qt = checkpoint.quantized.get(_stored_as(checkpoint, name))
        if qt is None or qt.format != declared.get(name):
            continue
        stored = spec_for(qt.format)  # None: one the kernels do not run ("int8_asym")
        if stored is None or fmt not in (stored, stored.dense_twin):
            continue
        q, zp = qt.q, qt.zero_point
        if zp is not None and qt.format.bits == 4 and min(q.min(), zp.min()) < 0:
            # compressed-tensors' int4 with zero points is signed ([-8, 7], both); the kernels'
            # nibbles hold [0, 15]: the same differences q - zp, offset by 8
            q, zp = q + np.int8(8), zp + np.int8(8)
        if fmt.sparse or qt.mask is None:
            packed[name] = pack_quantized(q, qt.scale, fmt, zp, qt.mask)
        else:  # a sparse checkpoint's integers in its dense twin: the pruned ones stored as 0
            packed[name] = pack_quantized(np.where(qt.mask, q, 0), qt.scale, fmt, zp)
    return packed


def native_sources(checkpoint: Checkpoint, formats: Mapping[str, FormatSpec]) -> LazyTensors:
    """What the native model packs each tensor from: the stored tensor where it runs in its
    stored float format (used in place: a view of the mapped file), else the fp32 values read
    for the conversion (a private copy, so converting a model does not map the whole file into
    the process on top of the converted weights)."""
    def source(name: str) -> Mapping[str, np.ndarray]:
        fmt = formats.get(name)
        same = fmt is None or fmt == float_format(checkpoint.stored_dtype(name))
        return checkpoint.stored if same else checkpoint.tensors

    return LazyTensors({name: partial(source(name).__getitem__, name)
                        for name in checkpoint.stored})


def embedding_format(checkpoint: Checkpoint, formats: Mapping[str, FormatSpec]
                     ) -> FormatSpec | None:
    """The packed format token lookups decode the embedding table from, or None for the
    table's stored float values. A table the checkpoint stores quantized (a GGUF Q8_0 or Q4_K
    token_embd) stays quantized, never held as fp32 (TinyLlama's: 262 MB in fp32, 39 MB as
    q4_k): tied to an integer lm_head, it is looked up in the head's packed rows (one copy of
    what is often the model's largest tensor: Gemma 3 270M's 168M of 268M weights); untied, in
    its declared format's own packed rows."""
    declared = checkpoint.weight_formats.get(EMBEDDING)
    if declared is None or declared.bits == 32:
        return None
    head = formats.get("lm_head.weight")
    if head is None or head.is_float:  # (weights="fp32": the file's values)
        return None
    return spec_for(runnable(declared)) if "lm_head.weight" in checkpoint.tensors else head


def embedding_packed(checkpoint: Checkpoint, formats: Mapping[str, FormatSpec]
                     ) -> PackedWeight | None:
    """An untied embedding table in embedding_format from its exact integers (a GGUF Q4_K
    token_embd), which packing its float values would requantize; None otherwise (packed from
    the values, or the tied head's rows)."""
    fmt = embedding_format(checkpoint, formats)
    qt = checkpoint.quantized.get(EMBEDDING)
    if fmt is None or qt is None or "lm_head.weight" not in checkpoint.tensors or \
            spec_for(qt.format) != fmt:
        return None
    return pack_quantized(qt.q, qt.scale, fmt, qt.zero_point, qt.mask)


def _stored_as(checkpoint: Checkpoint, name: str) -> str:
    """A tied lm_head is stored as the embedding table."""
    return EMBEDDING if name == "lm_head.weight" and name not in checkpoint.tensors else name


def _declared(checkpoint: Checkpoint) -> dict[str, WeightFormat]:
    declared = dict(checkpoint.weight_formats)
    emb = checkpoint.weight_formats.get(EMBEDDING)
    if "lm_head.weight" not in checkpoint.tensors and emb is not None and emb.bits < 32:
        # A tied lm_head runs in the embedding table's integer format (a float table's head
        # runs in the table's own float format, sharing its memory).
        declared["lm_head.weight"] = WeightFormat(bits=emb.bits, group_size=emb.group_size,
                                                  symmetric=emb.symmetric,
                                                  superblock=emb.superblock)
    return declared


def runnable(fmt: WeightFormat) -> WeightFormat:
    """The nearest format the kernels run: int8 with zero points or group scales is requantized
    symmetrically per channel (the int8 kernels have one scale per row; within one quantization
    step of the stored values), and int4 per channel is run in groups of 32. A 2:4 mask the
    kernels have no 2:4 format for (float weights, int4) runs as the bitmask it also is."""
    if fmt.bits == 8 and (not fmt.symmetric or fmt.group_size):
        fmt = replace(fmt, symmetric=True, group_size=None)
    if fmt.bits == 4 and not fmt.group_size:
        fmt = replace(fmt, group_size=32)
    if fmt.sparsity == Sparsity.TWO_FOUR and spec_for(fmt) is None:
        fmt = replace(fmt, sparsity=Sparsity.BITMASK)
    return fmt


def reference_tensors(
    checkpoint: Checkpoint, formats: Mapping[str, FormatSpec], packed: dict[str, PackedWeight]
) -> dict:
    """The checkpoint's tensors with each linear weight replaced by exactly what the native
    kernels multiply by, for the NumPy reference forward."""
    tensors = checkpoint.tensors
    packed = dict(packed)
    for name, fmt in formats.items():
        if fmt.layout is not FP32 and name not in packed:  # a tied lm_head packs the embedding
            packed[name] = pack(tensors[name if name in tensors else EMBEDDING], fmt)
    out = with_dequantized(tensors, packed)
    fmt = embedding_format(checkpoint, formats)
    if fmt is not None and "lm_head.weight" in checkpoint.tensors:  # its own packed rows
        embed = embedding_packed(checkpoint, formats) or pack(tensors[EMBEDDING], fmt)
        out[EMBEDDING] = with_dequantized({}, {EMBEDDING: embed})[EMBEDDING]
    elif fmt is not None:
        out[EMBEDDING] = out["lm_head.weight"]  # lookups decode the tied head's packed rows
    return out
