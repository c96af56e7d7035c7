"""GPT-NeoX (GPTNeoXForCausalLM: Pythia, GPT-NeoX-20B, ...): LayerNorm, partial half-split
RoPE, fused per-head qkv, parallel residual with two norms (or sequential), GELU MLP.

Config mapping, HF name map and load-time transforms only; the math is decoder.py's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .convert import (
    activation,
    common_args,
    gguf_rope,
    gguf_tensor_names,
    group_rows,
    layer_tensor_names,
    rename,
    rope_settings,
    split_qkv,
)
from .decoder import ModelArgs


def model_args(config: dict[str, Any]) -> ModelArgs:
    legacy = {"rope_theta": config.get("rotary_emb_base", 10000.0),
              "partial_rotary_factor": config.get("rotary_pct", 1.0)}
    theta, scaling, factor = rope_settings({**legacy, **config})
    heads = config["num_attention_heads"]
    head_dim = config["hidden_size"] // heads
    bias = bool(config.get("attention_bias", True))
    return ModelArgs(
        **common_args(config, hidden_size="hidden_size", intermediate_size="intermediate_size",
                      num_hidden_layers="num_hidden_layers", vocab_size="vocab_size",
                      norm_eps="layer_norm_eps", max_position_embeddings="max_position_embeddings",
                      bos_token_id="bos_token_id", eos_token_id="eos_token_id"),
        num_attention_heads=heads, norm="layer", rotary_dim=int(head_dim * factor),
        rope_theta=theta, rope_scaling=scaling,
        residual="parallel_two_norms" if config.get("use_parallel_residual", True)
        else "sequential",
        mlp="plain", activation=activation(config, "hidden_act", "gelu"),
        qkv_bias=bias, o_bias=bias, mlp_bias=True,
        tie_word_embeddings=config.get("tie_word_embeddings", False),
    )


_LAYER = {"input_layernorm": "input_layernorm",
          "post_attention_layernorm": "post_attention_layernorm",
          "attention.query_key_value": "self_attn.qkv_proj", "attention.dense": "self_attn.o_proj",
          "mlp.dense_h_to_4h": "mlp.up_proj", "mlp.dense_4h_to_h": "mlp.down_proj"}
HF_TENSOR_NAMES = {
    "gpt_neox.embed_in.weight": "model.embed_tokens.weight",
    "gpt_neox.final_layer_norm.weight": "model.norm.weight",
    "gpt_neox.final_layer_norm.bias": "model.norm.bias",
    "embed_out.weight": "lm_head.weight",
    **layer_tensor_names("gpt_neox.layers", _LAYER),
}
HF_IGNORED = (r"\.attention\.bias$", r"\.attention\.masked_bias$", r"rotary_emb\.inv_freq$")


def from_hf(raw: dict[str, np.ndarray], args: ModelArgs) -> dict[str, np.ndarray]:
    t = rename(raw, HF_TENSOR_NAMES, args.num_hidden_layers, HF_IGNORED)
    split_qkv_per_head(t, args)
    return t


def split_qkv_per_head(t: dict[str, np.ndarray], args: ModelArgs) -> None:
    """query_key_value rows are per head [q | k | v] (heads, 3, head_dim)."""
    group_rows(t, "self_attn.qkv_proj", args.num_attention_heads, 3, args.num_hidden_layers)
    split_qkv(t, args)



# ---- GGUF (llama.cpp arch "gptneox": qkv already regrouped to [all q; all k; all v]) -------
GGUF_TENSOR_NAMES = gguf_tensor_names()


def gguf_config(arch: str, get: Any) -> dict[str, Any]:
    hidden, heads = get("embedding_length"), get("attention.head_count")
    return {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
            "hidden_size": hidden, "num_hidden_layers": get("block_count"),
            "num_attention_heads": heads, "intermediate_size": get("feed_forward_length"),
            "max_position_embeddings": get("context_length"),
            "layer_norm_eps": get("attention.layer_norm_epsilon", 1e-5),
            "use_parallel_residual": bool(get("use_parallel_residual", True)),
            "rope_parameters": gguf_rope(get, hidden // heads), "hidden_act": "gelu"}


def from_gguf(t: dict[str, np.ndarray], args: ModelArgs, arch: str) -> dict[str, np.ndarray]:
    split_qkv(t, args)
    return t
