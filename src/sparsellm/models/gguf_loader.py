"""GGUF files: metadata -> HF-style config, tensors with canonical names: float tensors (F32,
F16, BF16) as memory-mapped views in their own dtype, quantized ones dequantized to fp32 at each
access and declared in the native format they run in (gguf_formats.py)."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..dtypes import BFLOAT16, as_float32
from ..tokenizer import Tokenizer
from .architectures import GGUFSpec, find_architecture
from .checkpoint import Checkpoint, check_tensors
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


def load_gguf(path: Path) -> Checkpoint:
    reader = open_gguf(path)
    meta = read_gguf_metadata(reader)
    arch_name = meta.get("general.architecture", "?")
    arch = find_architecture(arch_name, gguf=True)
    assert arch.gguf is not None
    names = {t.name for t in reader.tensors}
    config = gguf_config(meta, arch_name, names, arch.gguf)
    args = arch.args(config)
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
    check_tensors(tensors, args, str(path))
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
