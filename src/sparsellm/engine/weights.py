"""Which packed format each linear weight runs in, decided once when an engine is built."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from functools import partial

import numpy as np

from ..kernels import FORMATS, PackedWeight, get_isa, pack, parse_format
from ..kernels.formats import dense_twin, float_format, pack_quantized
from ..kernels.reference import with_dequantized
from ..models import Checkpoint
from ..models.decoder import EMBEDDING
from ..models.formats import Sparsity, WeightFormat
from ..models.lazy import LazyTensors

logger = logging.getLogger(__name__)


def weight_formats(checkpoint: Checkpoint, weights: str | None = None) -> dict[str, str]:
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
        formats = dict.fromkeys(names, weights)
        if "lm_head.weight" in formats:
            formats["lm_head.weight"] = dense_twin(weights)
        return formats
    formats = {}
    declared_formats = _declared(checkpoint)
    for name in names:
        declared = declared_formats.get(name)
        formats[name] = runnable(declared).name if declared else \
            float_format(checkpoint.stored_dtype(_stored_as(checkpoint, name)))
        try:  # an unsupported declared format fails here, by name
            parse_format(formats[name])
        except ValueError as e:
            files = checkpoint.source_files
            raise ValueError(f"{files[0] if len(files) == 1 else checkpoint.path}: tensor "
                             f"{name} is declared {formats[name]}, which the kernels do not "
                             f"run ({e})") from None
    dense = {name: dense_twin(fmt) for name, fmt in formats.items() if dense_on_this_cpu(fmt)}
    if dense:
        logger.info("%d bitmask int4 weights run as %s: dense int4 is faster on this CPU (%s); "
                    "weights=%r keeps them sparse", len(dense), ", ".join(sorted(set(
                        dense.values()))), get_isa(), formats[next(iter(dense))])
    return formats | dense


def dense_on_this_cpu(fmt: str) -> bool:
    """Whether a checkpoint's bitmask int4 weights run as their dense twin (the same integers,
    the pruned ones stored as zeros): on CPUs without AVX-512 (VBMI2's vpexpandb) the AVX2
    bitmask int4 GEMVs unpack each row's nibbles to bytes and expand them through table
    shuffles, at a third of the dense int4 GEMV's speed per token, which the 20% fewer bytes do
    not repay (kernels/bench.py at SmolLM2 shapes, 2 threads, Zen 3: 19-26 ms/token W4A16 g32
    bitmask, 8.7-8.8 dense; W4A8 18-19 and 6.9-8.6). Their prompts run level with dense int4
    (the same byte GEMM). The dense twin holds 25% more weight bytes."""
    s = parse_format(fmt)
    return s.sparsity is Sparsity.BITMASK and s.bits == 4 and get_isa() != "avx512"


def declared_packed(checkpoint: Checkpoint, formats: dict[str, str]) -> dict[str, PackedWeight]:
    """{name: packed exact integers} for the weights that run in the format the checkpoint
    declares and stores integers for (the others are packed from their float values)."""
    packed = {}
    declared = _declared(checkpoint)
    for name, fmt in formats.items():
        qt = checkpoint.quantized.get(_stored_as(checkpoint, name))
        if qt is None or qt.format != declared.get(name):
            continue
        stored = qt.format.name  # may be one the kernels do not run ("int8_asym")
        if fmt != stored and not (stored in FORMATS and fmt == dense_twin(stored)):
            continue
        q, zp = qt.q, qt.zero_point
        if zp is not None and qt.format.bits == 4 and min(q.min(), zp.min()) < 0:
            # compressed-tensors' int4 with zero points is signed ([-8, 7], both); the kernels'
            # nibbles hold [0, 15]: the same differences q - zp, offset by 8
            q, zp = q + np.int8(8), zp + np.int8(8)
        if parse_format(fmt).sparse or qt.mask is None:
            packed[name] = pack_quantized(q, qt.scale, fmt, zp, qt.mask)
        else:  # a sparse checkpoint's integers in its dense twin: the pruned ones stored as 0
            packed[name] = pack_quantized(np.where(qt.mask, q, 0), qt.scale, fmt, zp)
    return packed


def native_sources(checkpoint: Checkpoint, formats: dict[str, str]) -> LazyTensors:
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


def embedding_format(checkpoint: Checkpoint, formats: dict[str, str]) -> str | None:
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
    if head is None or parse_format(head).is_float:  # (weights="fp32": the file's values)
        return None
    return runnable(declared).name if "lm_head.weight" in checkpoint.tensors else head


def embedding_packed(checkpoint: Checkpoint, formats: dict[str, str]) -> PackedWeight | None:
    """An untied embedding table in embedding_format from its exact integers (a GGUF Q4_K
    token_embd), which packing its float values would requantize; None otherwise (packed from
    the values, or the tied head's rows)."""
    fmt = embedding_format(checkpoint, formats)
    qt = checkpoint.quantized.get(EMBEDDING)
    if fmt is None or qt is None or "lm_head.weight" not in checkpoint.tensors or \
            qt.format.name != fmt:
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
    if fmt.sparsity == Sparsity.TWO_FOUR and fmt.name not in FORMATS:
        fmt = replace(fmt, sparsity=Sparsity.BITMASK)
    return fmt


def reference_tensors(
    checkpoint: Checkpoint, formats: dict[str, str], packed: dict[str, PackedWeight]
) -> dict:
    """The checkpoint's tensors with each linear weight replaced by exactly what the native
    kernels multiply by, for the NumPy reference forward."""
    tensors = checkpoint.tensors
    packed = dict(packed)
    for name, fmt in formats.items():
        if fmt != "fp32" and name not in packed:  # a tied lm_head packs the embedding
            packed[name] = pack(tensors[name if name in tensors else EMBEDDING], fmt)
    out = with_dequantized(tensors, packed)
    fmt = embedding_format(checkpoint, formats)
    if fmt is not None and "lm_head.weight" in checkpoint.tensors:  # its own packed rows
        embed = embedding_packed(checkpoint, formats) or pack(tensors[EMBEDDING], fmt)
        out[EMBEDDING] = with_dequantized({}, {EMBEDDING: embed})[EMBEDDING]
    elif fmt is not None:
        out[EMBEDDING] = out["lm_head.weight"]  # lookups decode the tied head's packed rows
    return out
