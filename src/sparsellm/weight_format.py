"""The weight-format vocabulary, written once at the ground floor (below kernels/ and models/,
which both use it): the sparsity kinds, the format-name grammar and `WeightFormat`, what a
checkpoint declares for a tensor.

A format name is `[sparsity prefix] values [_g{group}] [_asym] [_a8]`: "sparse_int4_g32_a8" is
bitmask-sparse int4 values in groups of 32 columns with int8 activations. `format_name` writes
one and `parse_name` reads one (`FormatName`, its parts); whether a name is a format the kernels
run is kernels/formats.py `parse_format`'s answer (its `FORMATS` are written by `format_name`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum


class Sparsity(StrEnum):
    """Which weights a sparse format keeps (dense formats: None). The values are
    compressed-tensors' `sparsity_structure` names, and the C++ traits table's
    (csrc/include/formats.h `sparsity_name`)."""

    BITMASK = "unstructured"  # any: stored as kept values and one mask bit per column
    TWO_FOUR = "2:4"  # at most 2 of every 4 columns

    @property
    def prefixes(self) -> tuple[str, ...]:
        """Its format-name prefixes: the first is how names are written, others are accepted."""
        return SPARSITY_PREFIXES[self]


# Name prefix of each sparsity (None: dense): the first one is written, the others accepted.
SPARSITY_PREFIXES: dict[Sparsity | None, tuple[str, ...]] = {
    None: ("",), Sparsity.BITMASK: ("sparse_",), Sparsity.TWO_FOUR: ("2:4_", "sparse24_")}

# compressed-tensors' `sparsity_config.format` values: how sparse weights are stored on disk.
CT_DENSE = "dense"  # zeros stored in place (read by every compressed-tensors reader)
CT_BITMASK = "sparse-bitmask"  # kept values + a bitmask per row
CT_SPARSITY_FORMATS = (CT_DENSE, CT_BITMASK)


@dataclass(frozen=True)
class FormatName:
    """The parts of a format name."""

    values: str  # the stored values as a dense format spells them: "fp32", "int8", "q4_k", ...
    sparsity: Sparsity | None = None
    group: int = 0  # `_g{group}`; 0 when the name has none
    asym: bool = False  # `_asym`
    act_int8: bool = False  # `_a8`


def format_name(values: str, sparsity: Sparsity | None = None, group: int = 0,
                asym: bool = False, act_int8: bool = False, prefix: int = 0) -> str:
    """The name of a format (`prefix`: which of the sparsity's accepted prefixes). An N:M
    structure other than 2:4 (a recipe may prune 4:8) is written as its own prefix, a name no
    kernel runs."""
    prefixes = SPARSITY_PREFIXES.get(sparsity) or (f"{sparsity}_",)
    return prefixes[prefix] + values + (f"_g{group}" if group else "") + \
        ("_asym" if asym else "") + ("_a8" if act_int8 else "")


_NAME = re.compile(r"(?P<values>[a-z]+[0-9]+(?:_k)?)(?:_g(?P<group>[0-9]+))?"
                   r"(?P<asym>_asym)?(?P<a8>_a8)?")


def parse_name(name: str) -> FormatName:
    """A name's parts (the grammar only: kernels/formats.py `parse_format` says whether the
    kernels run it). Raises ValueError for a string outside the grammar."""
    sparsity, rest = next(((s, name[len(p):]) for s, ps in SPARSITY_PREFIXES.items()
                           for p in ps if p and name.startswith(p)), (None, name))
    m = _NAME.fullmatch(rest)
    if m is not None:
        return FormatName(m["values"], sparsity, int(m["group"] or 0), bool(m["asym"]),
                          bool(m["a8"]))
    raise ValueError(f"{name!r} is not a weight format name")


@dataclass(frozen=True)
class WeightFormat:
    """How a checkpoint declares one tensor is stored and should be run; `name` is the native
    kernel format that runs it (see `sparsellm.kernels.FORMATS`).

    A declared format, which may be one no kernel runs ("int8_asym", a 4:8 mask); what a
    kernel runs is a `FormatSpec` (kernels/layouts.py). kernels/formats.py `spec_for` is the one
    way from this to that (None where no kernel runs it), `FormatSpec.declared` the way back;
    both go through the name grammar above."""

    bits: int = 32  # 32 = float; 8 or 4 = integer weights
    group_size: int | None = None  # None = one scale per output channel
    symmetric: bool = True  # False = a zero point per group/channel
    activation_bits: int | None = None  # 8 = dynamic per-token int8 activations (W8A8)
    sparsity: Sparsity | None = None  # which weights are kept (None: all); a recipe's other
    # N:M structures ("4:8") are kept as their string (no kernel runs them)
    superblock: int | None = None  # 256: llama.cpp's K-quant form (group scales and mins in
    # 6 bits per superblock of columns), only as Q4_K ("q4_k")

    @property
    def name_parts(self) -> FormatName:
        """Its name's parts (a K-quant's group and zero points are part of its values' form)."""
        k_quant = bool(self.superblock)
        values = f"q{self.bits}_k" if k_quant else "fp32" if self.bits == 32 else \
            f"int{self.bits}"
        sparsity = self.sparsity
        if sparsity in SPARSITY_PREFIXES:
            sparsity = Sparsity(sparsity) if sparsity else None
        return FormatName(values, sparsity,
                          0 if k_quant else self.group_size or 0,
                          self.bits < 32 and not self.symmetric and not k_quant,
                          self.activation_bits == 8)

    @property
    def name(self) -> str:
        p = self.name_parts
        return format_name(p.values, p.sparsity, p.group, p.asym, p.act_int8)

    @classmethod
    def from_name(cls, name: str) -> WeightFormat:
        """The declared format a kernel format name runs (fp32 and integer values; the inverse
        of `name`). Raises ValueError for other names (fp16, bf16: a dtype, not a declaration)."""
        p = parse_name(name)
        m = re.fullmatch(r"(?:int(?P<bits>[48])|fp32|q(?P<k>4)_k)", p.values)
        if m is None:
            raise ValueError(f"{name!r} declares no WeightFormat")
        if m["k"]:
            return replace(Q4_K, activation_bits=8 if p.act_int8 else None, sparsity=p.sparsity)
        return cls(bits=int(m["bits"] or 32), group_size=p.group or None, symmetric=not p.asym,
                   activation_bits=8 if p.act_int8 else None, sparsity=p.sparsity)


# llama.cpp's Q4_K: 4-bit values with 6-bit group scales and mins in superblocks of 256 columns
Q4_K = WeightFormat(bits=4, group_size=32, symmetric=False, superblock=256)
