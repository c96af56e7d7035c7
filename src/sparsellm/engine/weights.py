"""Which packed format each linear weight runs in, decided once when an engine is built."""

from __future__ import annotations

import logging

import numpy as np

from ..kernels import FORMATS, PackedWeight, pack, parse_format
from ..kernels.formats import dense_twin, pack_quantized
from ..kernels.reference import dequantize
from ..models import Checkpoint

logger = logging.getLogger(__name__)


def weight_formats(
    checkpoint: Checkpoint, weights: str | None = None
) -> tuple[dict[str, str], dict[str, PackedWeight]]:
    """-> ({linear weight name: format}, {name: packed exact integers}).

    Declared formats win (`checkpoint.weight_formats`, with the stored integers packed as they
    are); `weights` instead converts every linear weight on load (a sparse format keeps the
    zeros of a pruned checkpoint; the never-pruned lm_head gets its dense twin); anything else
    is fp32.
    """
    names = checkpoint.architecture.module.linear_weight_names(checkpoint.args)
    if weights is not None:
        if weights not in FORMATS:
            raise ValueError(f"unknown weights format {weights!r}; accepted: {', '.join(FORMATS)}")
        formats = dict.fromkeys(names, weights)
        if "lm_head.weight" in formats:
            formats["lm_head.weight"] = dense_twin(weights)
        return formats, {}
    formats = {}
    packed = {}
    for name in names:
        declared = checkpoint.weight_formats.get(name)
        formats[name] = declared.name if declared else "fp32"
        parse_format(formats[name])  # an unsupported declared format fails here, by name
        qt = checkpoint.quantized.get(name)
        if qt is not None:
            q = qt.q
            if qt.format.bits == 8 and qt.zero_point is None and q.min(initial=0) < -127:
                # Some writers use [-128, 127]; the int8 kernels need |q| <= 127. Moving the
                # rare -128 to -127 changes those weights by one quantization step.
                logger.warning("%s: int8 weights with -128 clipped to -127", name)
                q = np.maximum(q, -127)
            packed[name] = pack_quantized(q, qt.scale, formats[name], qt.zero_point, qt.mask)
    return formats, packed


def reference_tensors(
    checkpoint: Checkpoint, formats: dict[str, str], packed: dict[str, PackedWeight]
) -> dict:
    """The checkpoint's tensors with each linear weight replaced by exactly what the native
    kernels multiply by, for the NumPy reference forward."""
    tensors = dict(checkpoint.tensors)
    head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])
    for name, fmt in formats.items():
        if fmt == "fp32" and name not in packed:
            continue
        w = packed.get(name) or pack(head if name == "lm_head.weight" else tensors[name], fmt)
        tensors[name] = dequantize(w)
    return tensors
