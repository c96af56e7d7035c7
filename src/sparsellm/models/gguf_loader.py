"""GGUF files: metadata -> HF-style config, tensors dequantized to fp32 with canonical names."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..tokenizer import Tokenizer
from .architectures import GGUFSpec, find_architecture
from .checkpoint import Checkpoint, check_tensors
from .convert import expand
from .lazy import LazyTensors


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


def load_gguf(path: Path) -> Checkpoint:
    import gguf

    reader = gguf.GGUFReader(str(path))
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
    # Dequantized at each access from the memory-mapped file, like safetensors checkpoints.
    raw = LazyTensors({name_map[t.name]: partial(_dequantize, t) for t in reader.tensors})
    tensors = arch.gguf.convert(raw if arch.gguf.lazy else dict(raw), args, arch_name)
    check_tensors(tensors, args, str(path))
    return Checkpoint(
        path=path,
        format="gguf",
        architecture=arch,
        config=config,
        tensors=tensors,
        tokenizer=Tokenizer.from_gguf_metadata(meta),
        generation_config={},
    )


def _dequantize(t: Any) -> np.ndarray:
    """One GGUF tensor as fp32 in (rows, cols) order."""
    import gguf

    w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims fastest-first
    return np.ascontiguousarray(w.reshape(shape))
