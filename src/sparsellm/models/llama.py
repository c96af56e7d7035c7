"""Llama family: Llama 2/3.x, SmolLM, TinyLlama, Mistral, Qwen2/2.5 (HF names are the canonical
ones).

Math lives in decoder.py; this file maps config.json to the decoder spec, and GGUF names and
layouts to canonical tensors. No file I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .convert import UnsupportedConfigError, activation, common_args, rope_settings
from .decoder import ModelArgs
from .lazy import transform_each


def model_args(config: dict[str, Any]) -> ModelArgs:
    """Build from an HF config.json dict; keys this architecture does not use are ignored."""
    qwen2 = config.get("model_type") == "qwen2" or \
        "Qwen2ForCausalLM" in config.get("architectures", [])
    attention_bias = bool(config.get("attention_bias", False))
    return ModelArgs(
        **llama_args(config),
        qkv_bias=qwen2 or attention_bias, o_bias=attention_bias and not qwen2,
        sliding_window=qwen_sliding_window(config) if qwen2 else
        None if config.get("use_sliding_window") is False else config.get("sliding_window"),
    )


def llama_args(config: dict[str, Any]) -> dict[str, Any]:
    """The ModelArgs keywords every Llama-like config.json spells the same way (sizes, norm
    epsilon, RoPE and its scaling, activation, MLP bias, tying, special ids)."""
    theta, scaling, _ = rope_settings(config)
    return dict(
        **common_args(config, hidden_size="hidden_size", intermediate_size="intermediate_size",
                      num_hidden_layers="num_hidden_layers", vocab_size="vocab_size",
                      num_attention_heads="num_attention_heads",
                      num_key_value_heads="num_key_value_heads", head_dim="head_dim",
                      norm_eps="rms_norm_eps", max_position_embeddings="max_position_embeddings",
                      tie_word_embeddings="tie_word_embeddings", bos_token_id="bos_token_id",
                      eos_token_id="eos_token_id"),
        rope_theta=theta, rope_scaling=scaling,
        activation=activation(config, "hidden_act", "silu"),
        mlp_bias=bool(config.get("mlp_bias", False)),
    )


def qwen_sliding_window(config: dict[str, Any]) -> int | None:
    """Qwen2/Qwen3: the attention window, from transformers >= 5 `layer_types`, else as
    transformers derives them (layers from `max_window_layers` on slide when
    `use_sliding_window`). One window for every layer or none; a mix is refused."""
    n = config["num_hidden_layers"]
    window = config.get("sliding_window") if config.get("use_sliding_window") else None
    types = config.get("layer_types") or [
        "sliding_attention" if window is not None and i >= config.get("max_window_layers", n)
        else "full_attention" for i in range(n)]
    if set(types) == {"full_attention"}:
        return None
    if set(types) == {"sliding_attention"} and config.get("sliding_window"):
        return int(config["sliding_window"])
    raise UnsupportedConfigError(
        f"config.json layer_types={types!r} (use_sliding_window="
        f"{config.get('use_sliding_window')!r}, max_window_layers="
        f"{config.get('max_window_layers')!r}) is not supported by sparsellm (one attention "
        "window for every layer); supported: every layer 'full_attention', or every layer "
        "'sliding_attention' with a sliding_window")


def from_hf(raw: dict[str, np.ndarray], args: ModelArgs) -> dict[str, np.ndarray]:
    return raw


# GGUF tensor name -> canonical name. "{i}" is the layer index.
GGUF_TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    "rope_freqs.weight": "rope_freqs.weight",
}
# GGUF archs whose Q/K rows llama.cpp permuted (qwen2 and qwen3 run NeoX, i.e. half-split,
# RoPE in llama.cpp: their rows stay in HF order)
_GGUF_PERMUTED_QK = ("llama", "mistral")


_HF_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
               "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}  # GGUF arch -> HF


def gguf_config(arch: str, get: Any) -> dict[str, Any]:
    """`{arch}.*` GGUF metadata (get(key, default)) -> the config.json keys model_args reads."""
    n_heads = get("attention.head_count")
    config = {
        "hidden_size": get("embedding_length"),
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": get("attention.head_count_kv", n_heads),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length", 2048),
    }
    if get("attention.key_length"):
        config["head_dim"] = get("attention.key_length")
    if get("rope.scaling.type") == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": get("rope.scaling.factor")}
    config["architectures"] = [_HF_CLASSES[arch]]
    return config


def from_gguf(t: Mapping[str, np.ndarray], args: ModelArgs, arch: str
              ) -> Mapping[str, np.ndarray]:
    """Tensor by tensor, at access (the loader passes a LazyTensors)."""
    if arch not in _GGUF_PERMUTED_QK:
        return t

    def unpermute(name: str, w: np.ndarray) -> np.ndarray:
        if name.endswith("q_proj.weight"):
            return unpermute_gguf_qk(w, args.num_attention_heads)
        if name.endswith("k_proj.weight"):
            return unpermute_gguf_qk(w, args.num_key_value_heads)
        return w

    return transform_each(t, unpermute)


def unpermute_gguf_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's convert-time row permutation of Q/K (interleaved -> half-split RoPE)."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    return np.ascontiguousarray(
        w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))
