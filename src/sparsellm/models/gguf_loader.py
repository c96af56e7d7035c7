"""GGUF files: metadata -> HF-style config, tensors dequantized to fp32 with canonical names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..tokenizer import Tokenizer
from .architectures import find_architecture
from .checkpoint import Checkpoint


def read_gguf_metadata(reader: Any) -> dict[str, Any]:
    meta = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        meta[key] = fld.contents()
    return meta


def gguf_config(meta: dict[str, Any], arch_name: str, tensor_names: set[str]) -> dict[str, Any]:
    """Translate `{arch}.*` metadata into the HF config.json keys our ModelArgs read."""

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch_name}.{key}", default)

    n_heads = get("attention.head_count")
    config: dict[str, Any] = {
        "model_type": arch_name,
        "hidden_size": get("embedding_length"),
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": get("attention.head_count_kv", n_heads),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length", 2048),
        "vocab_size": get("vocab_size", len(meta.get("tokenizer.ggml.tokens", []))),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    if get("attention.key_length"):
        config["head_dim"] = get("attention.key_length")
    if get("rope.scaling.type") == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": get("rope.scaling.factor")}
    if arch_name == "qwen2":
        config["architectures"] = ["Qwen2ForCausalLM"]
    return config


def load_gguf(path: Path) -> Checkpoint:
    import gguf

    reader = gguf.GGUFReader(str(path))
    meta = read_gguf_metadata(reader)
    arch_name = meta.get("general.architecture", "?")
    arch = find_architecture(arch_name, gguf=True)
    names = {t.name for t in reader.tensors}
    config = gguf_config(meta, arch_name, names)
    args = arch.module.ModelArgs.from_config(config)
    name_map = _expand_name_map(arch.module.GGUF_TENSOR_NAMES, args.num_hidden_layers)
    tensors = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            tensors[t.name] = np.asarray(t.data, dtype=np.float32)
            continue
        if t.name not in name_map:
            raise ValueError(f"{path}: unexpected tensor {t.name!r} for architecture {arch_name}")
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims fastest-first
        w = w.reshape(shape)
        canonical = name_map[t.name]
        if arch_name in arch.gguf_permuted_qk:
            if canonical.endswith("q_proj.weight"):
                w = arch.module.unpermute_gguf_qk(w, args.num_attention_heads)
            elif canonical.endswith("k_proj.weight"):
                w = arch.module.unpermute_gguf_qk(w, args.num_key_value_heads)
        tensors[canonical] = np.ascontiguousarray(w)
    return Checkpoint(
        path=path,
        format="gguf",
        architecture=arch,
        config=config,
        tensors=tensors,
        tokenizer=Tokenizer.from_gguf_metadata(meta),
        generation_config={},
    )


def _expand_name_map(template: dict[str, str], n_layers: int) -> dict[str, str]:
    out = {}
    for src, dst in template.items():
        if "{i}" in src:
            for i in range(n_layers):
                out[src.format(i=i)] = dst.format(i=i)
        else:
            out[src] = dst
    return out
