"""Qwen3 (dense): the Llama layout plus QK-norm, an RMSNorm over head_dim of every query and key
head before RoPE. head_dim is its own config key (128 in the released models, whatever
hidden_size / num_attention_heads is); small models tie the embeddings. HF names are the
canonical ones (decoder.py).

Math lives in decoder.py (`ModelArgs.qk_norm`); this file maps config.json and llama.cpp's
`qwen3` GGUF names to canonical ones (the metadata and the Q/K row order are Llama's: see
llama.py). No file I/O.
"""

from __future__ import annotations

from typing import Any

from . import llama
from .decoder import ModelArgs


def model_args(config: dict[str, Any]) -> ModelArgs:
    """Build from an HF config.json dict; keys this architecture does not use are ignored."""
    bias = bool(config.get("attention_bias", False))  # q, k, v and o alike, unlike Qwen2
    return ModelArgs(**llama.llama_args(config), qk_norm=True, qkv_bias=bias, o_bias=bias,
                     sliding_window=llama.qwen_sliding_window(config))


# llama.cpp's names (gguf MODEL_TENSORS[QWEN3]): Llama's plus the two QK-norm vectors
GGUF_TENSOR_NAMES = {
    **llama.GGUF_TENSOR_NAMES,
    "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "blk.{i}.attn_output.bias": "model.layers.{i}.self_attn.o_proj.bias",
}
