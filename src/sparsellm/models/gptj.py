"""GPT-J (GPTJForCausalLM) and CodeGen (CodeGenForCausalLM): one LayerNorm shared by attention
and MLP in parallel, partial interleaved RoPE, GELU MLP with biases, lm_head bias. CodeGen is
GPT-J with a fused qkv_proj in its own head layout.

Config mapping, HF name maps and load-time transforms only; the math is decoder.py's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .convert import (
    UnsupportedConfigError,
    activation,
    group_rows,
    layer_tensor_names,
    permute_rope_qk,
    rename,
    split_fused,
)
from .decoder import ModelArgs

CODEGEN_MP_NUM = 4  # CodeGen's qkv_proj rows are 4 model-parallel blocks of [q | v | k]


def model_args(config: dict[str, Any]) -> ModelArgs:
    if not config.get("rotary_dim"):
        raise UnsupportedConfigError(
            "config.json rotary_dim=null (RoPE over the whole hidden size) is not supported by "
            "sparsellm; supported: an even rotary_dim <= head_dim")
    d = config["n_embd"]
    return ModelArgs(
        hidden_size=d, intermediate_size=config.get("n_inner") or 4 * d,
        num_hidden_layers=config["n_layer"], num_attention_heads=config["n_head"],
        vocab_size=config["vocab_size"], norm="layer",
        norm_eps=config.get("layer_norm_epsilon", 1e-5), rotary_dim=config["rotary_dim"],
        residual="parallel", mlp="plain",
        activation=activation(config, "activation_function", "gelu_new"),
        mlp_bias=True, lm_head_bias=True,
        max_position_embeddings=config.get("n_positions", 2048),
        tie_word_embeddings=config.get("tie_word_embeddings", False),
        bos_token_id=config.get("bos_token_id"), eos_token_id=config.get("eos_token_id"),
    )


def _names(attention: dict[str, str]) -> dict[str, str]:
    layer = {"ln_1": "input_layernorm", **attention, "attn.out_proj": "self_attn.o_proj",
             "mlp.fc_in": "mlp.up_proj", "mlp.fc_out": "mlp.down_proj"}
    return {
        "transformer.wte.weight": "model.embed_tokens.weight",
        "transformer.ln_f.weight": "model.norm.weight",
        "transformer.ln_f.bias": "model.norm.bias",
        "lm_head.weight": "lm_head.weight",
        "lm_head.bias": "lm_head.bias",
        **layer_tensor_names("transformer.h", layer),
    }


GPTJ_HF_TENSOR_NAMES = _names({f"attn.{n}_proj": f"self_attn.{n}_proj" for n in "qkv"})
CODEGEN_HF_TENSOR_NAMES = _names({"attn.qkv_proj": "self_attn.qkv_proj"})
HF_IGNORED = (r"\.attn\.bias$", r"\.attn\.masked_bias$", r"\.attn\.causal_mask$")


def gptj_from_hf(raw: dict[str, np.ndarray], args: ModelArgs) -> dict[str, np.ndarray]:
    t = rename(raw, GPTJ_HF_TENSOR_NAMES, args.num_hidden_layers, HF_IGNORED)
    permute_rope_qk(t, args)
    return t


def codegen_args(config: dict[str, Any]) -> ModelArgs:
    args = model_args(config)
    if args.num_attention_heads % CODEGEN_MP_NUM:
        raise UnsupportedConfigError(f"config.json n_head={args.num_attention_heads}: CodeGen's "
                                     f"fused qkv layout needs a multiple of {CODEGEN_MP_NUM}")
    return args


def codegen_from_hf(raw: dict[str, np.ndarray], args: ModelArgs) -> dict[str, np.ndarray]:
    t = rename(raw, CODEGEN_HF_TENSOR_NAMES, args.num_hidden_layers, HF_IGNORED)
    # qkv_proj rows: (mp, [q, v, k], heads/mp * head_dim) -> ([q, v, k], mp, ...): heads stay in
    # CodeGen's order (block-major), the same for q, k and v.
    n = args.num_hidden_layers
    group_rows(t, "self_attn.qkv_proj", CODEGEN_MP_NUM, 3, n)
    d = args.hidden_size
    split_fused(t, "self_attn.qkv_proj", [("self_attn.q_proj", d), ("self_attn.v_proj", d),
                                          ("self_attn.k_proj", d)], n)
    permute_rope_qk(t, args)
    return t
