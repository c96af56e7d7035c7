"""OPT (OPTForCausalLM), pre-LayerNorm variants (125m, 1.3b and up): learned positions with
an offset of 2, LayerNorm, ReLU MLP, biases everywhere.

Config mapping, HF name map and load-time transforms only; the math is decoder.py's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .convert import UnsupportedConfigError, activation, layer_tensor_names, refuse, rename
from .decoder import ModelArgs

POSITION_OFFSET = 2  # OPT's learned position table starts at row 2


def model_args(config: dict[str, Any]) -> ModelArgs:
    refuse(config, "do_layer_norm_before", True, "post-LayerNorm (OPT-350m)")
    refuse(config, "_remove_final_layer_norm", False, "no final LayerNorm")
    refuse(config, "layer_norm_elementwise_affine", True, "LayerNorm without weights")
    d = config["hidden_size"]
    if config.get("word_embed_proj_dim", d) != d:
        raise UnsupportedConfigError(
            f"config.json word_embed_proj_dim={config['word_embed_proj_dim']} != hidden_size={d} "
            "is not supported by sparsellm (project_in/project_out, OPT-350m)")
    bias = bool(config.get("enable_bias", True))
    return ModelArgs(
        hidden_size=d, intermediate_size=config["ffn_dim"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"], vocab_size=config["vocab_size"],
        norm="layer", norm_eps=1e-5, rotary_dim=0, learned_positions=True, mlp="plain",
        activation=activation(config, "activation_function", "relu"),
        qkv_bias=bias, o_bias=bias, mlp_bias=bias,
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        tie_word_embeddings=config.get("tie_word_embeddings", True),
        bos_token_id=config.get("bos_token_id"), eos_token_id=config.get("eos_token_id"),
    )


_LAYER = {"self_attn_layer_norm": "input_layernorm", "self_attn.q_proj": "self_attn.q_proj",
          "self_attn.k_proj": "self_attn.k_proj", "self_attn.v_proj": "self_attn.v_proj",
          "self_attn.out_proj": "self_attn.o_proj", "final_layer_norm": "post_attention_layernorm",
          "fc1": "mlp.up_proj", "fc2": "mlp.down_proj"}
HF_TENSOR_NAMES = {
    "model.decoder.embed_tokens.weight": "model.embed_tokens.weight",
    "model.decoder.embed_positions.weight": "model.embed_positions.weight",
    "model.decoder.final_layer_norm.weight": "model.norm.weight",
    "model.decoder.final_layer_norm.bias": "model.norm.bias",
    "lm_head.weight": "lm_head.weight",
    **layer_tensor_names("model.decoder.layers", _LAYER),
}


def from_hf(raw: dict[str, np.ndarray], args: ModelArgs) -> dict[str, np.ndarray]:
    raw = {("model." + k if k.startswith("decoder.") else k): v for k, v in raw.items()}
    t = rename(raw, HF_TENSOR_NAMES, args.num_hidden_layers)
    # Row p of the canonical table is position p.
    t["model.embed_positions.weight"] = np.ascontiguousarray(
        t["model.embed_positions.weight"][POSITION_OFFSET:])
    return t
