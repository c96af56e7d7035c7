"""GPT-2 family (GPT2LMHeadModel): learned positions, LayerNorm, GELU MLP, Conv1D weights.

Config mapping, HF name map and load-time transforms only; the math is decoder.py's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .convert import (
    activation,
    gguf_tensor_names,
    layer_tensor_names,
    refuse,
    rename,
    split_qkv,
)
from .decoder import ModelArgs


def model_args(config: dict[str, Any]) -> ModelArgs:
    refuse(config, "scale_attn_by_inverse_layer_idx", False, "per-layer attention scaling")
    refuse(config, "scale_attn_weights", True, "unscaled attention scores")
    refuse(config, "add_cross_attention", False, "encoder-decoder cross-attention")
    d = config["n_embd"]
    return ModelArgs(
        hidden_size=d, intermediate_size=config.get("n_inner") or 4 * d,
        num_hidden_layers=config["n_layer"], num_attention_heads=config["n_head"],
        vocab_size=config["vocab_size"], norm="layer",
        norm_eps=config.get("layer_norm_epsilon", 1e-5), rotary_dim=0, learned_positions=True,
        mlp="plain", activation=activation(config, "activation_function", "gelu_new"),
        qkv_bias=True, o_bias=True, mlp_bias=True,
        max_position_embeddings=config.get("n_positions", 1024),
        tie_word_embeddings=config.get("tie_word_embeddings", True),
        bos_token_id=config.get("bos_token_id"), eos_token_id=config.get("eos_token_id"),
    )


_LAYER = {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm",
          "attn.c_attn": "self_attn.qkv_proj", "attn.c_proj": "self_attn.o_proj",
          "mlp.c_fc": "mlp.up_proj", "mlp.c_proj": "mlp.down_proj"}
HF_TENSOR_NAMES = {
    "transformer.wte.weight": "model.embed_tokens.weight",
    "transformer.wpe.weight": "model.embed_positions.weight",
    "transformer.ln_f.weight": "model.norm.weight",
    "transformer.ln_f.bias": "model.norm.bias",
    "lm_head.weight": "lm_head.weight",
    **layer_tensor_names("transformer.h", _LAYER),
}
HF_IGNORED = (r"\.attn\.bias$", r"\.attn\.masked_bias$")  # causal-mask buffers of old exports
_CONV1D = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj")


def from_hf(raw: dict[str, np.ndarray], args: ModelArgs) -> dict[str, np.ndarray]:
    if not any(k.startswith("transformer.") for k in raw):  # the original `gpt2` files
        raw = {("" if k.startswith("lm_head.") else "transformer.") + k: v
               for k, v in raw.items()}
    t = rename(raw, HF_TENSOR_NAMES, args.num_hidden_layers, HF_IGNORED)
    for i in range(args.num_hidden_layers):  # Conv1D stores (in, out): transpose to (out, in)
        for m in _CONV1D:
            name = f"model.layers.{i}.{m}.weight"
            t[name] = np.ascontiguousarray(t[name].T)
    split_qkv(t, args)
    return t


# ---- GGUF (llama.cpp arch "gpt2": Conv1D weights already transposed, fused [q; k; v]) ------
GGUF_TENSOR_NAMES = gguf_tensor_names()


def gguf_config(arch: str, get: Any) -> dict[str, Any]:
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "n_embd": get("embedding_length"), "n_layer": get("block_count"),
            "n_head": get("attention.head_count"), "n_inner": get("feed_forward_length"),
            "n_positions": get("context_length"),
            "layer_norm_epsilon": get("attention.layer_norm_epsilon", 1e-5),
            "activation_function": "gelu_new"}


def from_gguf(t: dict[str, np.ndarray], args: ModelArgs, arch: str) -> dict[str, np.ndarray]:
    split_qkv(t, args)
    return t
