"""compressed-tensors' quantization arguments <-> `WeightFormat`, written once.

The compression presets (compression/modifiers.py `PRESET_SCHEMES`), the writer
(compression/save.py `quantization_config`) and the reader (models/compressed.py) all describe
a format through these: `weight_args` / `activation_args` make the `weights` /
`input_activations` arguments of a config group, `weight_format` reads them back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .formats import Sparsity, WeightFormat

# compressed-tensors' defaults for arguments a config leaves out
DEFAULT_BITS = 8
DEFAULT_SYMMETRIC = True


def weight_args(fmt: WeightFormat) -> dict[str, Any]:
    """The `weights` arguments of an integer format: per output channel, or per group of
    columns (compressed-tensors' key order)."""
    return {"num_bits": fmt.bits, "type": "int", "symmetric": fmt.symmetric,
            "strategy": "group" if fmt.group_size else "channel", "group_size": fmt.group_size,
            "dynamic": False}


def activation_args(fmt: WeightFormat) -> dict[str, Any] | None:
    """The `input_activations` arguments of a format: dynamic symmetric per-token integers
    (`activation_bits`), or None for float activations."""
    if not fmt.activation_bits:
        return None
    return {"num_bits": fmt.activation_bits, "type": "int", "symmetric": True,
            "strategy": "token", "group_size": None, "dynamic": True}


def scheme_args(fmt: WeightFormat) -> dict[str, dict[str, Any]]:
    """A config group's `weights` and, with int8 activations, `input_activations`."""
    acts = activation_args(fmt)
    return {"weights": weight_args(fmt), **({"input_activations": acts} if acts else {})}


def weight_format(weights: Mapping[str, Any], input_activations: Mapping[str, Any] | None,
                  group_size: int | None = None,
                  sparsity: Sparsity | str | None = None) -> WeightFormat:
    """The format a config group's arguments declare (compressed-tensors' defaults for missing
    keys). `group_size`: the group the stored scales or the caller decided (None: per channel);
    `sparsity`: the structure of the weight's zeros, which the arguments do not say."""
    return WeightFormat(
        bits=weights.get("num_bits", DEFAULT_BITS), group_size=group_size,
        symmetric=weights.get("symmetric", DEFAULT_SYMMETRIC),
        activation_bits=input_activations.get("num_bits", DEFAULT_BITS)
        if input_activations else None,
        sparsity=sparsity)
