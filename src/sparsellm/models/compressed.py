"""Compressed-tensors checkpoints: HF folders whose config.json carries a `quantization_config`
(quant_method "compressed-tensors") and/or a `sparsity_config`, as written by
`sparsellm compress` and by llm-compressor / SparseML.

Stored forms read here (module prefix `m`, weight `m.weight`):
- int-quantized / naive-quantized: `m.weight` int8, `m.weight_scale` (out, groups)
  [+ `m.weight_zero_point`]
- pack-quantized: `m.weight_packed` int32 (eight 4-bit values per word, column 8j+i in bits
  4i..4i+3, offset by 8 to unsigned), `m.weight_shape`, `m.weight_scale`
  [+ `m.weight_zero_point` packed the same way along the output dimension]
- sparse-bitmask: `m.shape`, `m.compressed` (kept values, row-major), `m.bitmask` (uint8,
  np.packbits(..., bitorder="little") per row), `m.row_offsets`; applied to the int8 `weight`
  of int-quantized tensors or to float weights.
- sparsity stored densely (sparsity format "dense", or none declared): the zeros are measured and
  the measured structure is recorded as the tensor's declared format.

Checkpoint.tensors gets dequantized fp32; weight_formats / quantized the declared formats and
exact integers.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from .formats import QuantizedTensor, WeightFormat
from .lazy import LazyTensors

logger = logging.getLogger(__name__)

SUPPORTED_QUANT_FORMATS = ("int-quantized", "naive-quantized", "pack-quantized", "dense")
SUPPORTED_SPARSITY_FORMATS = ("sparse-bitmask", "dense")
BITMASK_PARTS = ("shape", "compressed", "bitmask", "row_offsets")
# A dense-stored weight is recorded as sparse when this fraction of it is exactly zero (a dense
# trained weight practically never has exact zeros).
MEASURED_SPARSITY_MIN = 0.3


# ---- codecs -------------------------------------------------------------------------------------
def pack_int32(values: np.ndarray, bits: int, axis: int = 1) -> np.ndarray:
    """Signed `bits`-bit integers (int8 array, 2-D) -> int32 words along `axis`, padded with
    zeros; value k of a word sits in bits [k*bits, (k+1)*bits), offset to unsigned."""
    per = 32 // bits
    v = (np.asarray(values).astype(np.int32) + (1 << (bits - 1))).astype(np.uint32)
    if axis == 0:
        return pack_int32(v.T.astype(np.int32) - (1 << (bits - 1)), bits, 1).T.copy()
    rows, cols = v.shape
    words = -(-cols // per)
    v = np.pad(v, ((0, 0), (0, words * per - cols)))
    packed = np.zeros((rows, words), dtype=np.uint32)
    for k in range(per):
        packed |= v[:, k::per] << np.uint32(bits * k)
    return packed.view(np.int32)


def unpack_int32(packed: np.ndarray, bits: int, length: int, axis: int = 1) -> np.ndarray:
    """Inverse of pack_int32: -> int8 values with `length` entries along `axis`."""
    if axis == 0:
        return unpack_int32(np.ascontiguousarray(packed.T), bits, length, 1).T.copy()
    per = 32 // bits
    p = np.ascontiguousarray(packed).view(np.uint32)
    out = np.empty((p.shape[0], p.shape[1] * per), dtype=np.int16)
    for k in range(per):
        out[:, k::per] = (p >> np.uint32(bits * k)) & np.uint32((1 << bits) - 1)
    return (out[:, :length] - (1 << (bits - 1))).astype(np.int8)


def bitmask_compress(dense: np.ndarray, keep: np.ndarray) -> dict[str, np.ndarray]:
    """(rows, cols) values + keep mask -> the four sparse-bitmask parts."""
    keep = np.asarray(keep, dtype=bool)
    counts = keep.sum(axis=1)
    return {
        "shape": np.asarray(dense.shape, dtype=np.int64),
        "compressed": np.ascontiguousarray(dense[keep]),
        "bitmask": np.packbits(keep, axis=-1, bitorder="little"),
        "row_offsets": (np.cumsum(counts) - counts).astype(np.int64),
    }


def bitmask_decompress(parts: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The four parts -> (dense values with zeros elsewhere, keep mask)."""
    shape = tuple(int(s) for s in np.asarray(parts["shape"]).reshape(-1))
    keep = np.unpackbits(np.asarray(parts["bitmask"], dtype=np.uint8), axis=-1,
                         count=shape[-1], bitorder="little").astype(bool).reshape(shape)
    values = np.asarray(parts["compressed"])
    if values.size != keep.sum():
        raise ValueError(f"sparse-bitmask tensor has {values.size} values for "
                         f"{int(keep.sum())} bitmask entries")
    dense = np.zeros(shape, dtype=values.dtype)
    dense[keep] = values
    return dense, keep


def _is_24(zero: np.ndarray) -> bool:
    return bool(zero.ndim == 2 and zero.shape[1] % 4 == 0 and zero.size and
                (zero.reshape(zero.shape[0], -1, 4).sum(-1) >= 2).all())


def mask_structure(keep: np.ndarray) -> str:
    """Structure of a stored keep mask (a measured fact): '2:4' or 'unstructured'."""
    return "2:4" if _is_24(~keep) else "unstructured"


def measured_structure(zero: np.ndarray) -> str | None:
    """'2:4' if every group of 4 consecutive weights of a row has >= 2 zeros, 'unstructured' if
    at least MEASURED_SPARSITY_MIN of the weights are zero, else None."""
    if _is_24(zero):
        return "2:4"
    return "unstructured" if zero.mean() >= MEASURED_SPARSITY_MIN else None


# ---- config -------------------------------------------------------------------------------------
def compression_configs(config: dict[str, Any]) -> tuple[dict | None, dict | None]:
    """(quantization config, sparsity config) of a config.json; sparsity may be nested in
    `quantization_config` (compressed-tensors), top-level, or under `compression_config`
    (SparseML)."""
    outer = config.get("quantization_config") or config.get("compression_config")
    sparsity = config.get("sparsity_config")
    quant = None
    if outer:
        outer = dict(outer)
        sparsity = outer.pop("sparsity_config", None) or sparsity
        if "quantization_config" in outer:  # SparseML: compression_config.quantization_config
            quant = outer["quantization_config"]
        elif outer.get("config_groups"):
            quant = outer
        method = outer.get("quant_method", "compressed-tensors")
        if method not in ("compressed-tensors", "sparseml"):
            raise ValueError(
                f"quant_method {method!r} is not supported; sparsellm reads compressed-tensors "
                f"checkpoints (formats: {', '.join(SUPPORTED_QUANT_FORMATS)}; sparsity: "
                f"{', '.join(SUPPORTED_SPARSITY_FORMATS)}), GGUF and float safetensors")
    return quant, sparsity


def is_compressed_config(config: dict[str, Any]) -> bool:
    return any(k in config for k in ("quantization_config", "compression_config",
                                      "sparsity_config"))


def _matches(target: str, module: str) -> int:
    """compressed-tensors target precedence: exact name 3, regex 2, class name 1, no match 0."""
    if target.startswith("re:"):
        return 2 if re.match(target[3:], module) else 0
    if target == module:
        return 3
    if target == "Linear":
        return 1 if module == "lm_head" or module.endswith("_proj") else 0
    if target == "Embedding":
        return 1 if module.endswith("embed_tokens") else 0
    return 0


def scheme_for(module: str, groups: dict[str, Any], ignore: list[str]) -> dict | None:
    if any(_matches(t, module) for t in ignore):
        return None
    best, best_rank = None, 0
    for group in groups.values():
        rank = max((_matches(t, module) for t in group.get("targets", [])), default=0)
        if rank > best_rank:
            best, best_rank = group, rank
    return best


def _targeted(module: str, cfg: dict[str, Any]) -> bool:
    if any(_matches(t, module) for t in cfg.get("ignore") or []):
        return False
    return any(_matches(t, module) for t in cfg.get("targets") or ["Linear"])


# ---- loading ------------------------------------------------------------------------------------
def decode_compressed_tensors(
    raw: Mapping[str, np.ndarray], config: dict[str, Any]
) -> tuple[LazyTensors[np.ndarray], dict[str, WeightFormat], LazyTensors[QuantizedTensor],
           list[str]]:
    """Stored tensors + config.json -> (fp32 tensors, declared formats, exact integers, notes).

    Formats are decided here (reading each weight once: a stored mask's structure, or zeros
    measured in a densely stored weight); the tensors and integers are decoded from `raw` again
    whenever they are accessed, so nothing stays in memory (see LazyTensors).
    """
    quant, sparsity = compression_configs(config)
    notes: list[str] = []
    measured: dict[str, float] = {}  # densely stored weights found sparse: {name: zero share}
    qformat = (quant or {}).get("format") or "dense"
    sformat = (sparsity or {}).get("format") or "dense"
    if sparsity and sformat not in SUPPORTED_SPARSITY_FORMATS:
        raise ValueError(f"sparsity format {sformat!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_SPARSITY_FORMATS)}")

    # 1. sparse-bitmask parts: weight name -> prefix of its four parts
    bitmasked: dict[str, str] = {}
    for key in raw:
        if key.endswith(".bitmask"):
            base = key[: -len(".bitmask")]
            missing = [p for p in BITMASK_PARTS if f"{base}.{p}" not in raw]
            if missing:
                raise ValueError(f"sparse-bitmask tensor {base} is missing parts: {missing}")
            bitmasked[base if base.endswith(".weight") else base + ".weight"] = base
    consumed = {f"{b}.{p}" for b in bitmasked.values() for p in BITMASK_PARTS}

    def stored(name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """The stored values of `name` (bitmask expanded, zeros elsewhere) and its keep mask."""
        base = bitmasked.get(name)
        if base is None:
            return np.asarray(raw[name]), None
        return bitmask_decompress({p: raw[f"{base}.{p}"] for p in BITMASK_PARTS})

    # 2. quantized weights
    tensors: dict[str, Callable[[], np.ndarray]] = {}
    formats: dict[str, WeightFormat] = {}
    quantized: dict[str, Callable[[], QuantizedTensor]] = {}
    groups = (quant or {}).get("config_groups") or {}
    modules = sorted({k.rsplit(".", 1)[0] for k in raw
                      if k.endswith((".weight_scale", ".weight_packed"))})
    for module in modules:
        scheme = scheme_for(module, groups, (quant or {}).get("ignore") or [])
        if scheme is None or not scheme.get("weights"):
            raise ValueError(f"{module} has quantization scales but no config group of "
                             "quantization_config targets it")
        if scheme["weights"].get("type", "int") != "int":
            raise ValueError(f"{module}: {scheme['weights'].get('type')} weights are not "
                             "supported; supported: int (4 and 8 bits)")
        fmt_name = scheme.get("format") or qformat
        if fmt_name not in SUPPORTED_QUANT_FORMATS:
            raise ValueError(f"{module}: quantization format {fmt_name!r} is not supported; "
                             f"supported: {', '.join(SUPPORTED_QUANT_FORMATS)}")
        name = module + ".weight"
        consumed |= {f"{module}.weight{s}" for s in ("", "_packed", "_shape", "_scale",
                                                      "_zero_point")}
        load = partial(_quantized_tensor, raw, stored, module, scheme, sparsity)
        qt = load()
        if qt is None:
            notes.append(f"{module}: stored as float ({fmt_name}); kept dense")
            consumed.discard(name)
            continue
        if qt.mask is not None and name not in bitmasked:
            measured[name] = 1 - float(qt.mask.mean())
        formats[name] = qt.format
        quantized[name] = load
        tensors[name] = lambda load=load: load().dequantize()

    # 3. float tensors (sparse-bitmask or dense)
    for name in [*(k for k in raw if k not in consumed),
                 *(n for n in bitmasked if n not in quantized)]:
        if name in bitmasked:
            formats[name] = WeightFormat(sparsity=mask_structure(stored(name)[1]))
        elif sparsity and name.endswith(".weight") and \
                _targeted(name[: -len(".weight")], sparsity):
            arr = stored(name)[0]
            found = measured_structure(arr == 0) if arr.ndim == 2 else None
            if found:
                formats[name] = WeightFormat(sparsity=found)
                measured[name] = float((arr == 0).mean())
        tensors[name] = lambda name=name: _float32(stored(name)[0])
    if measured:
        structures = sorted({formats[n].sparsity or "" for n in measured})
        notes.append(f"{len(measured)} weights stored densely are {min(measured.values()):.1%}"
                     f"-{max(measured.values()):.1%} zeros ({', '.join(structures)}): run as "
                     "sparse")
    return LazyTensors(tensors), formats, LazyTensors(quantized), notes


def _quantized_tensor(
    raw: Mapping[str, np.ndarray],
    stored: Callable[[str], tuple[np.ndarray, np.ndarray | None]],
    module: str, scheme: dict[str, Any], sparsity: dict[str, Any] | None,
) -> QuantizedTensor | None:
    """Decode one quantized weight from its stored arrays (None if its values are floats)."""
    wargs, aargs = scheme["weights"], scheme.get("input_activations")
    name = module + ".weight"
    bits = int(wargs.get("num_bits", 8))
    symmetric = bool(wargs.get("symmetric", True))
    keep = None
    if module + ".weight_packed" in raw:
        shape = [int(s) for s in np.asarray(raw[module + ".weight_shape"]).reshape(-1)]
        q = unpack_int32(raw[module + ".weight_packed"], bits, shape[1])
    else:
        q, keep = stored(name)
        if not np.issubdtype(q.dtype, np.integer):
            return None
        q = q.astype(np.int8)
    rows, cols = q.shape
    scale = _per_row(np.asarray(raw[module + ".weight_scale"], dtype=np.float32), rows)
    if not (np.isfinite(scale) & (scale >= 0)).all():  # e.g. llm-compressor 0.14's Embedding
        bad = scale[~(np.isfinite(scale) & (scale >= 0))]
        raise ValueError(f"{module}.weight_scale has {bad.size} negative or non-finite scales "
                         f"(e.g. {bad[0]:g}): the checkpoint is corrupt or its writer is broken")
    groups_n = scale.shape[1]
    zp = raw.get(module + ".weight_zero_point")
    if symmetric:
        zp = None
    elif zp is None:
        zp = np.zeros((rows, groups_n), dtype=np.int8)
    else:
        zp = np.asarray(zp)
        if zp.dtype == np.int32 and bits < 8 and zp.size != rows * groups_n:
            zp = unpack_int32(zp.reshape(-1, groups_n), bits, rows, axis=0)
        zp = _per_row(zp, rows).astype(np.int8)
    group_size = cols // groups_n if wargs.get("strategy") == "group" else None
    sparse = None
    if keep is not None:
        sparse = mask_structure(keep)
        if zp is not None:  # positions outside the bitmask hold the zero point (= 0.0)
            q = np.where(keep, q, np.repeat(zp, cols // groups_n, axis=1))
    elif not sparsity or _targeted(module, sparsity):
        zero = q == (0 if zp is None else np.repeat(zp, cols // groups_n, axis=1))
        sparse = measured_structure(zero)
        if sparse:
            keep = ~zero
    act = int(aargs["num_bits"]) if aargs else None
    fmt = WeightFormat(bits=bits, group_size=group_size, symmetric=symmetric,
                       activation_bits=act, sparsity=sparse)
    return QuantizedTensor(q=q, scale=scale, zero_point=zp, format=fmt, mask=keep)


def _float32(arr: np.ndarray) -> np.ndarray:
    return arr if arr.dtype == np.float32 else arr.astype(np.float32)


def _per_row(arr: np.ndarray, rows: int) -> np.ndarray:
    """A scale / zero point stored per tensor, per channel or per group -> (rows, groups)."""
    if arr.size == 1:
        return np.full((rows, 1), arr.reshape(-1)[0], dtype=arr.dtype)
    return np.ascontiguousarray(arr.reshape(rows, -1))
