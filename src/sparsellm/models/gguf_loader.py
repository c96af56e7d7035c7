"""GGUF files: metadata -> HF-style config, tensors with canonical names: float tensors (F32,
F16, BF16) as memory-mapped views in their own dtype, quantized ones dequantized to fp32."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..dtypes import BFLOAT16, as_float32
from ..tokenizer import Tokenizer
from .architectures import GGUFSpec, find_architecture
from .checkpoint import Checkpoint, check_tensors
from .convert import expand
from .lazy import LazyTensors, transform_each
from .safetensors_io import INTERRUPTED


def read_gguf_metadata(reader: Any) -> dict[str, Any]:
    meta = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        meta[key] = fld.contents()
    return meta


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


def open_gguf(path: Path) -> Any:
    """A GGUFReader over `path`, or a ValueError naming the file and what is wrong with it (a
    wrong magic, a header or tensor data cut short) instead of a NumPy error from inside."""
    import gguf

    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")

    header_read = False

    class CheckedReader(gguf.GGUFReader):
        def _build_tensors(self, start_offs: int, fields: list) -> None:
            nonlocal header_read
            header_read = True
            size = len(self.data)
            for field in fields:  # each tensor's data must lie inside the file
                _, name, _, dims, kind, offset = field.parts
                block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind[0])]
                end = int(start_offs + offset[0]) + int(np.prod(dims)) * type_size // block
                if end > size:
                    raise ValueError(f"{path}: truncated: tensor {bytes(name).decode()} ends at "
                                     f"byte {end} but the file has {size} bytes {INTERRUPTED}")
            super()._build_tensors(start_offs, fields)

    try:
        return CheckedReader(str(path))
    except (ValueError, IndexError) as e:
        if str(e).startswith(f"{path}:"):
            raise
        if header_read:
            raise ValueError(f"{path}: corrupt GGUF tensor table ({e})") from None
        raise ValueError(f"{path}: truncated GGUF header: the metadata runs past the end of the "
                         f"file ({path.stat().st_size} bytes; {INTERRUPTED[1:]}") from None


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
    return Checkpoint(
        path=path,
        format="gguf",
        architecture=arch,
        config=config,
        tensors=tensors,
        tokenizer=Tokenizer.from_gguf_metadata(meta),
        generation_config={},
        stored=stored,
        stored_dtypes=dtypes,
        source_files=[path],
    )


def _stored(t: Any) -> np.ndarray:
    """One GGUF tensor in (rows, cols) order: float types as views of the file in their own
    dtype, quantized types dequantized to fp32."""
    import gguf

    shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims fastest-first
    kind = gguf.GGMLQuantizationType
    if t.tensor_type in (kind.F32, kind.F16):
        return np.asarray(t.data).reshape(shape)
    if t.tensor_type == kind.BF16:
        return np.asarray(t.data).reshape(-1).view(np.uint8).view(BFLOAT16).reshape(shape)
    w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    return np.ascontiguousarray(w.reshape(shape))


def _stored_dtype(t: Any) -> np.dtype:
    """The dtype _stored(t) returns, without reading t."""
    import gguf

    kind = gguf.GGMLQuantizationType
    return {kind.F16: np.dtype(np.float16), kind.BF16: BFLOAT16}.get(t.tensor_type,
                                                                    np.dtype(np.float32))


def _float32(name: str, t: np.ndarray) -> np.ndarray:
    return as_float32(t)
