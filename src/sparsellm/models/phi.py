"""Phi-2 (PhiForCausalLM) and Phi-3 (Phi3ForCausalLM).

Phi-2: one LayerNorm shared by attention and MLP in parallel, partial half-split RoPE, GELU
MLP, biases everywhere (lm_head too). Phi-3: Llama math with fused qkv_proj and gate_up_proj.
Config mapping, HF name maps and load-time transforms only; the math is decoder.py's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .convert import (
    UnsupportedConfigError,
    activation,
    common_args,
    gguf_rope,
    gguf_tensor_names,
    layer_tensor_names,
    refuse,
    rename,
    rope_settings,
    split_fused,
    split_qkv,
)
from .decoder import ModelArgs

_SIZES = dict(hidden_size="hidden_size", intermediate_size="intermediate_size",
              num_hidden_layers="num_hidden_layers", vocab_size="vocab_size",
              num_attention_heads="num_attention_heads",
              num_key_value_heads="num_key_value_heads",
              max_position_embeddings="max_position_embeddings",
              tie_word_embeddings="tie_word_embeddings", bos_token_id="bos_token_id",
              eos_token_id="eos_token_id")


def _rotary_dim(config: dict[str, Any], factor: float) -> int:
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return int(head_dim * factor)


def phi2_args(config: dict[str, Any]) -> ModelArgs:
    refuse(config, "qk_layernorm", False, "LayerNorm on queries and keys")
    theta, scaling, factor = rope_settings(config)
    return ModelArgs(
        **common_args(config, norm_eps="layer_norm_eps", **_SIZES),
        norm="layer", rotary_dim=_rotary_dim(config, factor), rope_theta=theta,
        rope_scaling=scaling, residual="parallel", mlp="plain",
        activation=activation(config, "hidden_act", "gelu_new"),
        qkv_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=True,
    )


_PHI2_LAYER = {"input_layernorm": "input_layernorm", "self_attn.q_proj": "self_attn.q_proj",
               "self_attn.k_proj": "self_attn.k_proj", "self_attn.v_proj": "self_attn.v_proj",
               "self_attn.dense": "self_attn.o_proj", "mlp.fc1": "mlp.up_proj",
               "mlp.fc2": "mlp.down_proj"}
PHI2_HF_TENSOR_NAMES = {
    "model.embed_tokens.weight": "model.embed_tokens.weight",
    "model.final_layernorm.weight": "model.norm.weight",
    "model.final_layernorm.bias": "model.norm.bias",
    "lm_head.weight": "lm_head.weight",
    "lm_head.bias": "lm_head.bias",
    **layer_tensor_names("model.layers", _PHI2_LAYER),
}


def phi2_from_hf(raw: dict[str, np.ndarray], args: ModelArgs) -> dict[str, np.ndarray]:
    return rename(raw, PHI2_HF_TENSOR_NAMES, args.num_hidden_layers, (r"rotary_emb\.inv_freq$",))


def phi3_args(config: dict[str, Any]) -> ModelArgs:
    theta, scaling, factor = rope_settings(config)
    return ModelArgs(
        **common_args(config, norm_eps="rms_norm_eps", head_dim="head_dim", **_SIZES),
        rotary_dim=_rotary_dim(config, factor), rope_theta=theta, rope_scaling=scaling,
        activation=activation(config, "hidden_act", "silu"),
        sliding_window=config.get("sliding_window"),
    )


_PHI3_LAYER = ("input_layernorm", "post_attention_layernorm", "self_attn.qkv_proj",
               "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
PHI3_HF_TENSOR_NAMES = {
    "model.embed_tokens.weight": "model.embed_tokens.weight",
    "model.norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
    **{f"model.layers.{{i}}.{m}.weight": f"model.layers.{{i}}.{m}.weight" for m in _PHI3_LAYER},
}


def phi3_from_hf(raw: dict[str, np.ndarray], args: ModelArgs) -> dict[str, np.ndarray]:
    t = rename(raw, PHI3_HF_TENSOR_NAMES, args.num_hidden_layers, (r"rotary_emb\.inv_freq$",))
    split_phi3_fused(t, args)
    return t


def split_phi3_fused(t: dict[str, np.ndarray], args: ModelArgs) -> None:
    split_qkv(t, args)
    i = args.intermediate_size
    split_fused(t, "mlp.gate_up_proj", [("mlp.gate_proj", i), ("mlp.up_proj", i)],
                args.num_hidden_layers)


# ---- GGUF (llama.cpp archs "phi2" and "phi3"; both use half-split ("neox") RoPE) -----------
def _gguf_sizes(get: Any) -> dict[str, Any]:
    heads = get("attention.head_count")
    return {"hidden_size": get("embedding_length"), "num_hidden_layers": get("block_count"),
            "num_attention_heads": heads,
            "num_key_value_heads": get("attention.head_count_kv", heads),
            "intermediate_size": get("feed_forward_length"),
            "max_position_embeddings": get("context_length"),
            "rope_parameters": gguf_rope(get, get("embedding_length") // heads)}


def phi2_gguf_config(arch: str, get: Any) -> dict[str, Any]:
    return {"architectures": ["PhiForCausalLM"], "model_type": "phi", **_gguf_sizes(get),
            "layer_norm_eps": get("attention.layer_norm_epsilon", 1e-5),
            "hidden_act": "gelu_new"}


def phi2_from_gguf(t: dict[str, np.ndarray], args: ModelArgs, arch: str) -> dict[str, np.ndarray]:
    split_qkv(t, args)  # older conversions store a fused attn_qkv
    return t


def phi3_gguf_config(arch: str, get: Any) -> dict[str, Any]:
    return {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", **_gguf_sizes(get),
            "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-5),
            "sliding_window": get("attention.sliding_window") or None, "hidden_act": "silu"}


def phi3_from_gguf(t: dict[str, np.ndarray], args: ModelArgs, arch: str) -> dict[str, np.ndarray]:
    if "rope_factors_long.weight" in t:
        raise UnsupportedConfigError("Phi-3 long-context RoPE (GGUF rope_factors_long, "
                                     "rope_scaling longrope) is not supported by sparsellm")
    split_phi3_fused(t, args)
    return t


PHI2_GGUF_TENSOR_NAMES = gguf_tensor_names()
PHI3_GGUF_TENSOR_NAMES = {**gguf_tensor_names(ffn_up="mlp.gate_up_proj"),
                          "rope_factors_long.weight": "rope_factors_long.weight",
                          "rope_factors_short.weight": "rope_factors_short.weight"}
