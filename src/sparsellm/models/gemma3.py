"""Gemma 3 (text): Llama's layout plus QK-norm, norms on the attention and MLP outputs too
("sandwich" norms), GeGLU (tanh GELU), token embeddings scaled by sqrt(hidden), attention scaled
by query_pre_attn_scalar**-0.5, and interleaved layers: five sliding-window layers (local RoPE
base, 10k) for each full-attention one (global base, 1M, with the config's scaling); tied
embeddings.

Gemma's RMSNorm multiplies by (1 + w): the HF weights get the 1 added at load, so the decoder's
plain RMSNorm runs them (llama.cpp's converter stores them with the 1 already added).

Math lives in decoder.py; this file maps config.json, HF names and llama.cpp's `gemma3` GGUF names
to the decoder spec and canonical tensors. No file I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np

from . import llama
from .convert import (
    UnsupportedConfigError,
    activation,
    common_args,
    expand,
    layer_tensor_names,
    refuse,
    rope_settings,
)
from .decoder import ModelArgs
from .lazy import LazyTensors

# Gemma's chat format (its tokenizer_config.json template, text only), for GGUF files that carry
# none (llama.cpp likewise recognizes Gemma's turns): a system message opens the first user turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
LOCAL_ROPE_THETA = 10000.0  # Gemma 3's rope_local_base_freq (llama.cpp hard-codes it too)
SLIDING_PATTERN = 6  # one full-attention layer in every six (the released models)


def model_args(config: dict[str, Any]) -> ModelArgs:
    """Build from an HF config.json dict (transformers 4.x `rope_theta` / `rope_local_base_freq`
    or 5.x per-layer-type `rope_parameters`); keys this architecture does not use are ignored."""
    refuse(config, "attn_logit_softcapping", (None,), "attention logit soft-capping")
    refuse(config, "use_bidirectional_attention", False, "bidirectional attention")
    rope = config.get("rope_parameters") or {}
    if "full_attention" in rope:  # transformers >= 5: one RoPE per layer type
        theta, scaling, _ = rope_settings({"rope_parameters": rope["full_attention"]})
        local = rope.get("sliding_attention", {}).get("rope_theta", LOCAL_ROPE_THETA)
    else:
        theta, scaling, _ = rope_settings(config, 1_000_000.0)
        local = config.get("rope_local_base_freq", LOCAL_ROPE_THETA)
    n = config["num_hidden_layers"]
    types = config.get("layer_types") or [
        "full_attention" if (i + 1) % config.get("sliding_window_pattern", SLIDING_PATTERN) == 0
        else "sliding_attention" for i in range(n)]
    bias = bool(config.get("attention_bias", False))
    return ModelArgs(
        **common_args(config, hidden_size="hidden_size", intermediate_size="intermediate_size",
                      num_hidden_layers="num_hidden_layers", vocab_size="vocab_size",
                      num_attention_heads="num_attention_heads",
                      num_key_value_heads="num_key_value_heads", head_dim="head_dim",
                      norm_eps="rms_norm_eps", max_position_embeddings="max_position_embeddings",
                      bos_token_id="bos_token_id", eos_token_id="eos_token_id"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        rope_theta=theta, rope_scaling=scaling, local_rope_theta=float(local),
        activation=activation(config, "hidden_activation", "gelu_pytorch_tanh"),
        qk_norm=True, qkv_bias=bias, o_bias=bias, sandwich_norms=True,
        layer_types=list(types), sliding_window=config.get("sliding_window"),
        attention_scale=1.0 / math.sqrt(config.get("query_pre_attn_scalar", 256)),
        embed_scale=math.sqrt(config["hidden_size"]),
        final_logit_softcap=config.get("final_logit_softcapping"),
    )


# HF name -> canonical name ("{i}" is the layer index). Gemma's post_attention_layernorm is
# the norm of the attention output; its MLP input norm is pre_feedforward_layernorm.
_NORMS = {"input_layernorm": "input_layernorm", "self_attn.q_norm": "self_attn.q_norm",
          "self_attn.k_norm": "self_attn.k_norm", "post_attention_layernorm": "attn_output_norm",
          "pre_feedforward_layernorm": "post_attention_layernorm",
          "post_feedforward_layernorm": "mlp_output_norm"}
HF_TENSOR_NAMES = {
    **{n: n for n in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")},
    **layer_tensor_names("model.layers", {m: m for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}),
    **{f"model.layers.{{i}}.{src}.weight": f"model.layers.{{i}}.{dst}.weight"
       for src, dst in _NORMS.items()},
}


def from_hf(raw: Mapping[str, np.ndarray], args: ModelArgs) -> Mapping[str, np.ndarray]:
    """Rename, and add Gemma's 1 to every norm weight; tensor by tensor, at access."""
    lookup = expand(HF_TENSOR_NAMES, args.num_hidden_layers)
    unknown = [n for n in raw if n not in lookup]
    if unknown:
        raise UnsupportedConfigError(
            f"unexpected tensors for Gemma 3: {sorted(unknown)[:5]} ({len(unknown)} in all); "
            "sparsellm runs the text model (Gemma3ForCausalLM)")

    def load(src: str) -> np.ndarray:
        t = raw[src]
        return t + np.float32(1) if src.endswith("norm.weight") else t

    return LazyTensors({lookup[n]: partial(load, n) for n in raw})


# llama.cpp's names (gguf MODEL_TENSORS[GEMMA3]): Llama's plus QK-norm and the sandwich
# norms; its norms already hold 1 + w, and its Q/K rows are in HF order (half-split RoPE), so
# llama.from_gguf changes nothing.
GGUF_TENSOR_NAMES = {
    **llama.GGUF_TENSOR_NAMES,
    "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "blk.{i}.post_attention_norm.weight": "model.layers.{i}.attn_output_norm.weight",
    "blk.{i}.post_ffw_norm.weight": "model.layers.{i}.mlp_output_norm.weight",
}


def gguf_config(arch: str, get: Any) -> dict[str, Any]:
    """`gemma3.*` GGUF metadata -> the config.json keys model_args reads, as llama.cpp reads
    them (its gemma3 graph: local RoPE base 10k and one global layer in six, both fixed; the
    27B model, 62 layers, scales attention by hidden / heads instead of head_dim)."""
    heads = get("attention.head_count")
    layers = get("block_count")
    head_dim = get("attention.key_length", get("embedding_length") // heads)
    config = {
        "hidden_size": get("embedding_length"),
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": get("rope.freq_base", 1_000_000.0),
        "rope_local_base_freq": LOCAL_ROPE_THETA,
        "sliding_window": get("attention.sliding_window", 512),
        "max_position_embeddings": get("context_length", 32768),
        "query_pre_attn_scalar": get("embedding_length") // heads if layers == 62 else head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "architectures": ["Gemma3ForCausalLM"],
    }
    if get("rope.scaling.type") == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": get("rope.scaling.factor")}
    return config
