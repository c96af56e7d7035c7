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
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from ..weight_format import CT_DENSE, CT_SPARSITY_FORMATS
from .ct_args import weight_format
from .formats import QuantizedTensor, Sparsity, WeightFormat
from .lazy import LazyTensors

logger = logging.getLogger(__name__)

SUPPORTED_QUANT_FORMATS = ("int-quantized", "naive-quantized", "pack-quantized", "dense")
SUPPORTED_SPARSITY_FORMATS = CT_SPARSITY_FORMATS
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


def mask_structure(keep: np.ndarray) -> Sparsity:
    """Structure of a stored keep mask (a measured fact): 2:4 or unstructured (a bitmask)."""
    return Sparsity.TWO_FOUR if _is_24(~keep) else Sparsity.BITMASK


def measured_structure(zero: np.ndarray) -> Sparsity | None:
    """2:4 if every group of 4 consecutive weights of a row has >= 2 zeros, unstructured if
    at least MEASURED_SPARSITY_MIN of the weights are zero, else None."""
    if _is_24(zero):
        return Sparsity.TWO_FOUR
    return Sparsity.BITMASK if zero.mean() >= MEASURED_SPARSITY_MIN else None


# ---- config -------------------------------------------------------------------------------------
class Where:
    """Where a checkpoint's parts come from, for errors that name the file: config.json for
    the compression sections, the safetensors file holding each stored tensor."""

    def __init__(self, config_file: str = "config.json", files: Mapping[str, str] | None = None):
        self.config_file = config_file
        self.files = dict(files or {})

    def config(self, key: str, value: Any, expected: str) -> ValueError:
        return ValueError(f"{self.config_file}: {key} is {_short(value)}; {expected}")

    def tensor(self, name: str, message: str) -> ValueError:
        return ValueError(f"{self.files.get(name, self.config_file)}: tensor {name} {message}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_targets(value: Any, key: str, where: Where) -> None:
    """A list of target names, class names or `re:` regular expressions."""
    if not (isinstance(value, list) and all(isinstance(t, str) for t in value)):
        raise where.config(key, value, "expected a list of module names, class names or "
                           "`re:` patterns")
    for t in value:
        if t.startswith("re:"):
            try:
                re.compile(t[3:])
            except re.error as e:
                raise where.config(key, value, f"{t!r} is not a regular expression ({e})") \
                    from None


def _check_args(args: Any, key: str, where: Where, bits: tuple[int, ...]) -> None:
    """Quantization arguments sparsellm runs: integers of `bits`, symmetric or not, per tensor,
    channel, group (of a positive size) or token."""
    if args is None:
        return
    if not isinstance(args, dict):
        raise where.config(key, args, "expected quantization arguments (a mapping) or null")
    if args.get("type", "int") != "int":
        raise where.config(f"{key}.type", args.get("type"), "supported: int (4 and 8 bits)")
    n = args.get("num_bits", 8)
    if not _is_int(n) or n not in bits:
        raise where.config(f"{key}.num_bits", n, f"supported: {', '.join(map(str, bits))}")
    if not isinstance(args.get("symmetric", True), bool):
        raise where.config(f"{key}.symmetric", args["symmetric"], "expected true or false")
    strategy, size = args.get("strategy"), args.get("group_size")
    if strategy not in (None, "tensor", "channel", "group", "token"):
        raise where.config(f"{key}.strategy", strategy,
                           "supported: tensor, channel, group, token")
    if size is not None and not (_is_int(size) and size >= 1):
        raise where.config(f"{key}.group_size", size, "expected a positive integer or null")
    if strategy == "group" and size is None:
        raise where.config(f"{key}.group_size", size, "strategy 'group' needs a group size")


def _check_scheme(scheme: Any, key: str, where: Where) -> None:
    if not isinstance(scheme, dict):
        raise where.config(key, scheme, "expected a config group (a mapping)")
    _check_targets(scheme.get("targets", []), f"{key}.targets", where)
    _check_args(scheme.get("weights"), f"{key}.weights", where, (4, 8))
    _check_args(scheme.get("input_activations"), f"{key}.input_activations", where, (8,))
    fmt = scheme.get("format")
    if fmt is not None and fmt not in SUPPORTED_QUANT_FORMATS:
        raise where.config(f"{key}.format", fmt,
                           f"supported: {', '.join(SUPPORTED_QUANT_FORMATS)}")


def compression_configs(config: dict[str, Any], where: Where | None = None,
                        ) -> tuple[dict | None, dict | None]:
    """(quantization config, sparsity config) of a config.json; sparsity may be nested in
    `quantization_config` (compressed-tensors), top-level, or under `compression_config`
    (SparseML). Both are checked: what sparsellm reads from them has the types and values it
    runs, or the error names the key."""
    where = where or Where()
    key = "quantization_config" if config.get("quantization_config") is not None else \
        "compression_config"
    outer = config.get(key)
    sparsity, skey = config.get("sparsity_config"), "sparsity_config"
    quant, qkey = None, key
    if outer is not None and not isinstance(outer, dict):
        raise where.config(key, outer, "expected a mapping")
    if outer:
        outer = dict(outer)
        nested = outer.pop("sparsity_config", None)
        if nested:
            sparsity, skey = nested, f"{key}.sparsity_config"
        method = outer.get("quant_method", "compressed-tensors")
        if method not in ("compressed-tensors", "sparseml"):
            raise where.config(
                f"{key}.quant_method", method,
                f"quant_method {method!r} is not supported; sparsellm reads compressed-tensors "
                f"checkpoints (formats: {', '.join(SUPPORTED_QUANT_FORMATS)}; sparsity: "
                f"{', '.join(SUPPORTED_SPARSITY_FORMATS)}), GGUF and float safetensors")
        if "quantization_config" in outer:  # SparseML: compression_config.quantization_config
            quant, qkey = outer["quantization_config"], f"{key}.quantization_config"
        elif outer.get("config_groups"):
            quant = outer
    if quant is not None:
        if not isinstance(quant, dict):
            raise where.config(qkey, quant, "expected a mapping")
        groups = quant.get("config_groups") or {}
        if not isinstance(groups, dict):
            raise where.config(f"{qkey}.config_groups", groups, "expected a mapping of groups")
        for name, scheme in groups.items():
            _check_scheme(scheme, f"{qkey}.config_groups.{name}", where)
        _check_targets(quant.get("ignore") or [], f"{qkey}.ignore", where)
        fmt = quant.get("format")
        if fmt is not None and not isinstance(fmt, str):
            raise where.config(f"{qkey}.format", fmt, "expected a format name")
    if sparsity is not None and not isinstance(sparsity, dict):
        raise where.config(skey, sparsity, "expected a mapping")
    if sparsity:
        fmt = sparsity.get("format") or CT_DENSE
        if fmt not in SUPPORTED_SPARSITY_FORMATS:
            raise where.config(f"{skey}.format", fmt,
                               f"sparsity format {fmt!r} is not supported; supported: "
                               f"{', '.join(SUPPORTED_SPARSITY_FORMATS)}")
        for k in ("targets", "ignore"):
            _check_targets(sparsity.get(k) or [], f"{skey}.{k}", where)
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
@dataclass
class Decoded:
    """A compressed-tensors checkpoint's tensors under canonical names."""

    tensors: LazyTensors[np.ndarray]  # fp32 values, decoded at each access
    formats: dict[str, WeightFormat]  # declared formats
    quantized: LazyTensors[QuantizedTensor]  # exact integers, decoded at each access
    notes: list[str]
    shapes: dict[str, tuple[int, ...]]  # of every tensor, known without decoding it again


def decode_compressed_tensors(
    raw: Mapping[str, np.ndarray], config: dict[str, Any], where: Where | None = None,
    stored_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> Decoded:
    """Stored tensors + config.json -> fp32 tensors, declared formats, exact integers, notes
    and shapes (`stored_shapes`: of the stored tensors, from the files' headers).

    Formats are decided here (reading each weight once: a stored mask's structure, or zeros
    measured in a densely stored weight); the tensors and integers are decoded from `raw` again
    whenever they are accessed, so nothing stays in memory (see LazyTensors). A stored part
    that disagrees with the others or with the config is refused by name (`where`).
    """
    where = where or Where()
    quant, sparsity = compression_configs(config, where)
    notes: list[str] = []
    measured: dict[str, float] = {}  # densely stored weights found sparse: {name: zero share}
    qformat = (quant or {}).get("format") or "dense"
    shapes = dict(stored_shapes or {})

    # 1. sparse-bitmask parts: weight name -> prefix of its four parts
    bitmasked: dict[str, str] = {}
    for key in raw:
        if key.endswith(".bitmask"):
            base = key[: -len(".bitmask")]
            missing = [p for p in BITMASK_PARTS if f"{base}.{p}" not in raw]
            if missing:
                raise where.tensor(key, f"is a sparse-bitmask part without the others: "
                                        f"{missing} are missing")
            bitmasked[base if base.endswith(".weight") else base + ".weight"] = base
    consumed = {f"{b}.{p}" for b in bitmasked.values() for p in BITMASK_PARTS}

    def stored(name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """The stored values of `name` (bitmask expanded, zeros elsewhere) and its keep mask."""
        base = bitmasked.get(name)
        if base is None:
            return np.asarray(raw[name]), None
        return _bitmask_parts(raw, base, where)

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
            raise where.tensor(f"{module}.weight_scale", "holds quantization scales but no "
                               "config group of quantization_config targets it")
        fmt_name = scheme.get("format") or qformat
        if fmt_name not in SUPPORTED_QUANT_FORMATS:
            raise where.config("quantization_config.format", fmt_name,
                               f"supported: {', '.join(SUPPORTED_QUANT_FORMATS)}")
        name = module + ".weight"
        if not (name in raw or name in bitmasked or module + ".weight_packed" in raw):
            raise where.tensor(f"{module}.weight_scale", "has no weight beside it")
        consumed |= {f"{module}.weight{s}" for s in ("", "_packed", "_shape", "_scale",
                                                      "_zero_point")}
        load = partial(_quantized_tensor, raw, stored, module, scheme, sparsity, where)
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
        shapes[name] = qt.q.shape

    # 3. float tensors (sparse-bitmask or dense)
    for name in [*(k for k in raw if k not in consumed),
                 *(n for n in bitmasked if n not in quantized)]:
        if name in bitmasked:
            values, keep = stored(name)
            formats[name] = WeightFormat(sparsity=mask_structure(keep))
            shapes[name] = values.shape
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
    shapes = {n: tuple(s) for n, s in shapes.items() if n in tensors}
    return Decoded(LazyTensors(tensors), formats, LazyTensors(quantized), notes, shapes)


def _bitmask_parts(raw: Mapping[str, np.ndarray], base: str,
                   where: Where) -> tuple[np.ndarray, np.ndarray]:
    """bitmask_decompress of one weight's parts, checked against each other first."""
    parts = {p: np.asarray(raw[f"{base}.{p}"]) for p in BITMASK_PARTS}
    shape, bitmask, values = parts["shape"], parts["bitmask"], parts["compressed"]
    if not (np.issubdtype(shape.dtype, np.integer) and shape.size == 2 and (shape > 0).all()):
        raise where.tensor(f"{base}.shape", f"is {_short(shape.tolist())}; expected the "
                           "weight's (rows, columns)")
    rows, cols = (int(s) for s in shape.reshape(-1))
    if bitmask.dtype != np.uint8 or bitmask.shape != (rows, -(-cols // 8)):
        raise where.tensor(f"{base}.bitmask", f"is {bitmask.dtype} of shape {bitmask.shape}; "
                           f"a ({rows}, {cols}) weight needs uint8 of shape "
                           f"{(rows, -(-cols // 8))}")
    if values.ndim != 1:
        raise where.tensor(f"{base}.compressed", f"has shape {values.shape}; expected the "
                           "kept values in one row")
    try:
        return bitmask_decompress(parts)
    except ValueError as e:  # bitmask_decompress's own count check
        raise where.tensor(f"{base}.compressed", f"does not match its bitmask: {e}") from None


def _quantized_tensor(
    raw: Mapping[str, np.ndarray],
    stored: Callable[[str], tuple[np.ndarray, np.ndarray | None]],
    module: str, scheme: dict[str, Any], sparsity: dict[str, Any] | None, where: Where,
) -> QuantizedTensor | None:
    """Decode one quantized weight from its stored arrays (None if its values are floats),
    refusing parts whose shapes or values disagree with each other or with the scheme."""
    wargs, aargs = scheme["weights"], scheme.get("input_activations")
    name = module + ".weight"
    declared = weight_format(wargs, aargs)
    bits, symmetric = declared.bits, declared.symmetric
    keep = None
    if module + ".weight_packed" in raw:
        if module + ".weight_shape" not in raw:
            raise where.tensor(module + ".weight_packed", "has no weight_shape beside it")
        packed = np.asarray(raw[module + ".weight_packed"])
        shape = np.asarray(raw[module + ".weight_shape"])
        if not (np.issubdtype(shape.dtype, np.integer) and shape.size == 2 and
                (shape > 0).all()):
            raise where.tensor(module + ".weight_shape", f"is {_short(shape.tolist())}; "
                               "expected the weight's (rows, columns)")
        rows, cols = (int(s) for s in shape.reshape(-1))
        want = (rows, -(-cols * bits // 32))
        if packed.dtype != np.int32 or packed.shape != want:
            raise where.tensor(module + ".weight_packed", f"is {packed.dtype} of shape "
                               f"{packed.shape}; {bits}-bit values of a ({rows}, {cols}) weight "
                               f"pack into int32 of shape {want}")
        q = unpack_int32(packed, bits, cols)
    else:
        q, keep = stored(name)
        if not np.issubdtype(q.dtype, np.integer):
            return None
        if q.ndim != 2:
            raise where.tensor(name, f"has shape {q.shape}; expected (rows, columns)")
        q = q.astype(np.int8)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if q.size and not (lo <= q.min() and q.max() <= hi):
        raise where.tensor(name, f"holds values from {q.min()} to {q.max()}; {bits}-bit "
                           f"integers are {lo} to {hi}")
    rows, cols = q.shape
    scale = np.asarray(raw[module + ".weight_scale"], dtype=np.float32)
    groups_n = _groups(scale, rows, cols, module + ".weight_scale", where)
    group_size = cols // groups_n if groups_n > 1 or wargs.get("strategy") == "group" else None
    scale = _per_row(scale, rows)
    if not (np.isfinite(scale) & (scale >= 0)).all():  # e.g. llm-compressor 0.14's Embedding
        bad = scale[~(np.isfinite(scale) & (scale >= 0))]
        raise where.tensor(f"{module}.weight_scale", f"has {bad.size} negative or non-finite "
                           f"scales (e.g. {bad[0]:g}): the checkpoint is corrupt or its writer "
                           "is broken")
    zp = raw.get(module + ".weight_zero_point")
    if symmetric:
        zp = None
    elif zp is None:
        zp = np.zeros((rows, groups_n), dtype=np.int8)
    else:
        zp = np.asarray(zp)
        if not np.issubdtype(zp.dtype, np.integer):
            raise where.tensor(module + ".weight_zero_point", f"is {zp.dtype}; expected "
                               "integers")
        if zp.dtype == np.int32 and bits < 8 and zp.size not in (1, rows * groups_n):
            packed_rows = -(-rows // (32 // bits))  # packed along the rows, as written
            if zp.size != packed_rows * groups_n:
                raise where.tensor(module + ".weight_zero_point", f"has shape {zp.shape}; "
                                   f"{bits}-bit zero points of {rows} rows and {groups_n} "
                                   f"groups pack into {(packed_rows, groups_n)}")
            zp = unpack_int32(zp.reshape(-1, groups_n), bits, rows, axis=0)
        if zp.size not in (1, rows * groups_n):
            raise where.tensor(module + ".weight_zero_point", f"has shape {zp.shape}; "
                               f"expected one zero point per scale ({rows}, {groups_n})")
        zp = _per_row(zp, rows)
        if not (lo <= zp.min() and zp.max() <= hi):
            raise where.tensor(module + ".weight_zero_point", f"holds values from {zp.min()} "
                               f"to {zp.max()}; {bits}-bit integers are {lo} to {hi}")
        zp = np.ascontiguousarray(np.broadcast_to(zp, (rows, groups_n))).astype(np.int8)
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
    fmt = replace(declared, group_size=group_size, sparsity=sparse)
    return QuantizedTensor(q=q, scale=scale, zero_point=zp, format=fmt, mask=keep)


def _groups(scale: np.ndarray, rows: int, cols: int, name: str, where: Where) -> int:
    """How many groups of columns a weight's scales are for: one scale per tensor or per row
    (1), or per row and group of columns (the group size dividing the columns)."""
    groups_n = 1 if scale.size == 1 else scale.size // rows
    if scale.size != 1 and (scale.size % rows or scale.ndim > 2 or
                            (scale.ndim == 2 and scale.shape[0] != rows) or cols % groups_n):
        raise where.tensor(name, f"has shape {scale.shape}; a ({rows}, {cols}) weight takes "
                           "one scale, one per row, or one per row and group of columns")
    return groups_n


def _float32(arr: np.ndarray) -> np.ndarray:
    return arr if arr.dtype == np.float32 else arr.astype(np.float32)


def _per_row(arr: np.ndarray, rows: int) -> np.ndarray:
    """A scale / zero point stored per tensor, per channel or per group -> (rows, groups)."""
    if arr.size == 1:
        return np.full((rows, 1), arr.reshape(-1)[0], dtype=arr.dtype)
    return np.ascontiguousarray(arr.reshape(rows, -1))
