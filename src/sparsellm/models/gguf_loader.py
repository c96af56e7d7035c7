"""GGUF files: metadata -> HF-style config, tensors with canonical names: float tensors (F32,
F16, BF16) as memory-mapped views in their own dtype, quantized ones dequantized to fp32 at each
access and declared in the native format they run in (gguf_formats.py)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..dtypes import BFLOAT16, as_float32
from ..tokenizer import Tokenizer
from .architectures import GGUFSpec, find_architecture
from .checkpoint import Checkpoint, check_layers, check_tensors
from .convert import expand
from .formats import QuantizedTensor, WeightFormat
from .gguf_formats import DECLARED, EXACT, check_type, exact_integers, summary
from .gguf_reader import GGUFFile, GGUFTensor
from .lazy import LazyTensors, transform_each

logger = logging.getLogger(__name__)

# Float types _stored gives as views of the file, in the dtype each has there, by their
# gguf.GGMLQuantizationType code (F32, F16, BF16: gguf is imported once a file is opened).
_FLOAT_TYPES = {0: np.dtype(np.float32), 1: np.dtype(np.float16), 30: BFLOAT16}


def read_gguf_metadata(reader: GGUFFile | Any) -> dict[str, Any]:
    """The key/values of a GGUFFile (or of a `gguf.GGUFReader`), without the GGUF.* header."""
    if isinstance(reader, GGUFFile):
        return dict(reader.metadata)
    return {key: fld.contents() for key, fld in reader.fields.items()
            if not key.startswith("GGUF.")}


def gguf_config(meta: dict[str, Any], arch_name: str, tensor_names: set[str],
                spec: GGUFSpec) -> dict[str, Any]:
    """Translate `{arch}.*` metadata into the HF config.json keys the architecture reads."""

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch_name}.{key}", default)

    config: dict[str, Any] = {
        "model_type": arch_name,
        "vocab_size": get("vocab_size", len(meta.get("tokenizer.ggml.tokens", []))),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    config.update(spec.config(arch_name, get))
    return config


def open_gguf(path: Path) -> GGUFFile:
    """The header, metadata and tensor table of `path`, its tensors memory-mapped, or a
    ValueError naming the file and what is wrong with it (a wrong magic, a header or tensor
    data cut short, a corrupt tensor table)."""
    return GGUFFile(path)


# What the metadata keys the loader reads hold (llama.cpp's gguf-py constants): `{arch}.` keys
# by the rest of their name, tokenizer keys in full. Checked before anything uses them, so a
# damaged value is refused by its key instead of failing as a TypeError deep in the loader.
def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _count_or_zero(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "count": (_count, "a positive integer"),
    "count0": (_count_or_zero, "a non-negative integer"),
    "number": (_number, "a finite number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "a bool"),
    "strings": (_strings, "an array of strings"),
    "counts0": (lambda v: isinstance(v, list) and all(_count_or_zero(x) for x in v),
                "an array of non-negative integers"),
    "numbers": (lambda v: isinstance(v, list) and all(_number(x) for x in v),
                "an array of finite numbers"),
}
ARCH_KEYS = {
    **dict.fromkeys(("context_length", "embedding_length", "block_count", "feed_forward_length",
                     "attention.head_count", "attention.head_count_kv", "attention.key_length",
                     "attention.value_length", "vocab_size"), "count"),
    **dict.fromkeys(("rope.dimension_count", "attention.sliding_window"), "count0"),
    **dict.fromkeys(("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon",
                     "rope.freq_base", "rope.scaling.factor", "final_logit_softcapping"),
                    "number"),
    "rope.scaling.type": "str", "use_parallel_residual": "bool",
}
REQUIRED_ARCH_KEYS = ("block_count", "embedding_length", "feed_forward_length",
                      "attention.head_count")
TOKENIZER_KEYS = {
    "tokenizer.ggml.model": "str", "tokenizer.ggml.pre": "str",
    "tokenizer.ggml.tokens": "strings", "tokenizer.ggml.merges": "strings",
    "tokenizer.ggml.token_type": "counts0", "tokenizer.ggml.scores": "numbers",
    "tokenizer.ggml.add_bos_token": "bool", "tokenizer.ggml.add_eos_token": "bool",
    "tokenizer.ggml.add_space_prefix": "bool", "tokenizer.chat_template": "str",
    **{f"tokenizer.ggml.{name}_token_id": "count0"
       for name in ("bos", "eos", "unknown", "padding", "eot", "eom", "seperator", "cls",
                    "mask")},
}
TOKENIZER_MODELS = ("gpt2", "llama")  # Tokenizer.from_gguf_metadata's


def check_metadata(meta: dict[str, Any], path: Path) -> None:
    """Refuse metadata the loader cannot use, naming the key: an architecture it does not run,
    a value of the wrong kind, a tokenizer without tokens or whose per-token arrays have other
    lengths."""

    def refuse(key: str, what: str) -> ValueError:
        text = repr(meta[key]) if key in meta else "missing"
        text = text if len(text) <= 60 else text[:57] + "..."
        return ValueError(f"{path}: GGUF key {key} is {text}; {what}")

    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise refuse("general.architecture", "expected the architecture's name")
    try:
        find_architecture(arch, gguf=True)
    except ValueError as e:
        raise ValueError(f"{path}: GGUF key general.architecture: {e}") from None
    for key in REQUIRED_ARCH_KEYS:
        if f"{arch}.{key}" not in meta:
            raise refuse(f"{arch}.{key}", "the model's sizes need it")
    keys = {f"{arch}.{k}": kind for k, kind in ARCH_KEYS.items()} | TOKENIZER_KEYS
    for key, kind in keys.items():
        ok, expected = _KINDS[kind]
        if key in meta and not ok(meta[key]):
            raise refuse(key, f"expected {expected}")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise refuse("tokenizer.ggml.tokens", "sparsellm needs the vocabulary in the file")
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if key in meta and len(meta[key]) != len(tokens):
            raise refuse(key, f"expected one entry per token ({len(tokens)})")
    model = meta.get("tokenizer.ggml.model")
    if model not in TOKENIZER_MODELS:
        raise refuse("tokenizer.ggml.model", f"supported: {', '.join(TOKENIZER_MODELS)}")
    if model == "gpt2" and not all(" " in m for m in meta.get("tokenizer.ggml.merges", [])):
        raise refuse("tokenizer.ggml.merges", "expected merges written 'a b'")


def load_gguf(path: Path) -> Checkpoint:
    reader = open_gguf(path)
    meta = read_gguf_metadata(reader)
    check_metadata(meta, path)
    arch_name = meta["general.architecture"]
    arch = find_architecture(arch_name, gguf=True)
    assert arch.gguf is not None
    names = {t.name for t in reader.tensors}
    config = gguf_config(meta, arch_name, names, arch.gguf)
    try:
        args = arch.args(config)
    except ValueError as e:  # ModelArgs' own checks (e.g. heads and kv_heads that disagree)
        raise type(e)(f"{path}: GGUF metadata keys {arch_name}.*: {e}") from None
    check_layers(args, len(reader.tensors), str(path))  # before names are made per layer
    name_map = expand(arch.gguf.tensor_names, args.num_hidden_layers)
    unexpected = [t.name for t in reader.tensors if t.name not in name_map]
    if unexpected:
        raise ValueError(f"{path}: unexpected tensor {unexpected[0]!r} for architecture "
                         f"{arch_name}")
    for t in reader.tensors:
        check_type(t.tensor_type.name, t.name, path)
    # Read (and dequantized) at each access from the memory-mapped file, like safetensors.
    raw = LazyTensors({name_map[t.name]: partial(_stored, t) for t in reader.tensors})
    if arch.gguf.lazy:
        stored = arch.gguf.convert(raw, args, arch_name)
        tensors = transform_each(stored, _float32)
        dtypes = {name_map[t.name]: _stored_dtype(t) for t in reader.tensors}
    else:  # the conversion needs every tensor at once (e.g. fused ones split): fp32 throughout
        stored, dtypes = None, {}
        tensors = arch.gguf.convert({n: as_float32(t) for n, t in raw.items()}, args, arch_name)
    check_tensors(tensors, args, str(path), {name_map[t.name]: t.shape for t in reader.tensors}
                  if arch.gguf.lazy else None)
    # Quantized 2-D weights run in their nearest native format (the declared one), Q4_0 from
    # its exact integers; a fused tensor split at load (lazy=False) runs as its float values.
    quantized_2d = {name_map[t.name]: t for t in reader.tensors
                    if t.tensor_type.name in DECLARED and len(t.shape) == 2}
    formats: dict[str, WeightFormat] = {}
    if arch.gguf.lazy:
        formats = {n: DECLARED[t.tensor_type.name] for n, t in quantized_2d.items()}
        note = summary([t.tensor_type.name for t in quantized_2d.values()])
        if note:
            logger.info("%s: %s", path.name, note)
    exact = LazyTensors({n: partial(_integers, t, n, partial(arch.gguf.convert, args=args,
                                                             arch=arch_name))
                         for n, t in quantized_2d.items()
                         if n in formats and t.tensor_type.name in EXACT})
    return Checkpoint(
        path=path,
        format="gguf",
        architecture=arch,
        config=config,
        tensors=tensors,
        tokenizer=Tokenizer.from_gguf_metadata(
            {"tokenizer.chat_template": arch.chat_template, **meta}),
        generation_config={},
        weight_formats=formats,
        quantized=exact,
        stored=stored,
        stored_dtypes=dtypes,
        source_files=[path],
    )


def _integers(t: GGUFTensor, name: str, convert: Any) -> QuantizedTensor:
    """Q4_0's or Q4_K's exact integers, with the architecture's row reordering (Llama's Q/K)
    applied to the integers, scales and codes alike, as to the values."""
    qt = exact_integers(t.tensor_type.name, t.data, t.shape)
    qt.q, qt.scale = (convert({name: a})[name] for a in (qt.q, qt.scale))
    if qt.zero_point is not None:
        qt.zero_point = convert({name: qt.zero_point})[name]
    return qt


def _stored(t: GGUFTensor) -> np.ndarray:
    """One GGUF tensor in (rows, cols) order: float types as views of the file in their own
    dtype, quantized types dequantized to fp32."""
    if t.tensor_type in _FLOAT_TYPES:
        return t.data
    import gguf

    w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    return np.ascontiguousarray(w.reshape(t.shape))


def _stored_dtype(t: GGUFTensor) -> np.dtype:
    """The dtype _stored(t) returns, without reading t."""
    return _FLOAT_TYPES.get(t.tensor_type, np.dtype(np.float32))


def _float32(name: str, t: np.ndarray) -> np.ndarray:
    return as_float32(t)
