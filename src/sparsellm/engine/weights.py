"""Which packed format each linear weight runs in, decided once when an engine is built."""

from __future__ import annotations

import logging

import numpy as np

from ..kernels import FORMATS, PackedWeight, pack, parse_format
from ..kernels.formats import dense_twin, float_format, pack_quantized
from ..kernels.reference import with_dequantized
from ..models import Checkpoint
from ..models.formats import WeightFormat

logger = logging.getLogger(__name__)
EMBEDDING = "model.embed_tokens.weight"


def weight_formats(
    checkpoint: Checkpoint, weights: str | None = None
) -> tuple[dict[str, str], dict[str, PackedWeight]]:
    """-> ({linear weight name: format}, {name: packed exact integers}).

    Declared formats win (`checkpoint.weight_formats`, with the stored integers packed as they
    are; a tied lm_head follows the embedding's); `weights` instead converts every linear weight
    on load (a sparse format keeps the zeros of a pruned checkpoint; the never-pruned lm_head
    gets its dense twin); anything else runs in the float format it is stored in (bf16 or fp16
    checkpoints stay bf16 or fp16, never widened; everything else fp32).
    """
    names = checkpoint.linear_weight_names
    if weights is not None:
        if weights not in FORMATS:
            raise ValueError(f"unknown weights format {weights!r}; accepted: {', '.join(FORMATS)}")
        formats = dict.fromkeys(names, weights)
        if "lm_head.weight" in formats:
            formats["lm_head.weight"] = dense_twin(weights)
        return formats, {}
    formats = {}
    packed = {}
    declared_formats = dict(checkpoint.weight_formats)
    stored_as = {}  # a tied lm_head is stored as the embedding table
    if "lm_head.weight" not in checkpoint.tensors:
        head = tied_head_format(checkpoint)
        if head is not None:
            declared_formats["lm_head.weight"] = head
        stored_as["lm_head.weight"] = EMBEDDING
    stored = checkpoint.stored
    for name in names:
        declared = declared_formats.get(name)
        formats[name] = declared.name if declared else \
            float_format(stored[stored_as.get(name, name)].dtype)
        parse_format(formats[name])  # an unsupported declared format fails here, by name
        qt = checkpoint.quantized.get(stored_as.get(name, name))
        if qt is not None and qt.format == declared:  # else packed from the fp32 values
            q = qt.q
            if qt.format.bits == 8 and qt.zero_point is None and q.min(initial=0) < -127:
                # Some writers use [-128, 127]; the int8 kernels need |q| <= 127. Moving the
                # rare -128 to -127 changes those weights by one quantization step.
                logger.warning("%s: int8 weights with -128 clipped to -127", name)
                q = np.maximum(q, -127)
            packed[name] = pack_quantized(q, qt.scale, formats[name], qt.zero_point, qt.mask)
    return formats, packed


def tied_head_format(checkpoint: Checkpoint) -> WeightFormat | None:
    """The format a tied lm_head runs in: the embedding table's declared weight format, with
    8-bit zero points dropped (the int8 kernels are symmetric; such a table is requantized
    symmetrically, within one quantization step of the stored values); None for a float table
    (the head then runs in the table's own float format, sharing its memory)."""
    emb = checkpoint.weight_formats.get(EMBEDDING)
    if emb is None or emb.bits == 32:
        return None
    if emb.bits == 8:
        return WeightFormat(bits=8)
    return WeightFormat(bits=emb.bits, group_size=emb.group_size or 32, symmetric=emb.symmetric)


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
    return with_dequantized(tensors, packed)
