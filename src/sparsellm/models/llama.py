"""Llama-family architecture: Llama 2/3, SmolLM, TinyLlama, Mistral, Qwen2.

Math only: a `ModelArgs` built from an HF-style config dict, the canonical weight names, the
GGUF weight-name map, and a NumPy forward over a flat batch of tokens. No file I/O, no sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from .rope import rope_inv_freq


@dataclass
class ModelArgs:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v (and o) biases, Llama-style
    qkv_bias: bool = False  # q/k/v biases only, Qwen2-style
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelArgs:
        """Build from an HF config.json dict; keys this architecture does not use are ignored."""
        known = {f.name for f in fields(cls)} - {"extra", "qkv_bias"}
        args = {k: v for k, v in config.items() if k in known}
        # transformers >= 5 saves `rope_parameters` ({"rope_type", "rope_theta", scaling keys})
        # instead of the 4.x `rope_theta` + `rope_scaling` keys.
        rope = config.get("rope_parameters")
        if isinstance(rope, dict):
            rope = dict(rope)
            if "rope_theta" in rope:
                args["rope_theta"] = rope.pop("rope_theta")
            if rope.get("rope_type", rope.get("type", "default")) != "default":
                args["rope_scaling"] = rope
        if config.get("model_type") == "qwen2" or "Qwen2ForCausalLM" in config.get(
            "architectures", []
        ):
            args["qkv_bias"] = True
            args.pop("attention_bias", None)
        if config.get("use_sliding_window") is False:
            args.pop("sliding_window", None)
        return cls(**args)


def layer_weight_names(args: ModelArgs, i: int) -> list[str]:
    """Canonical (Hugging Face) names of layer i's tensors."""
    p = f"model.layers.{i}."
    names = [
        p + "input_layernorm.weight",
        p + "post_attention_layernorm.weight",
        p + "self_attn.q_proj.weight",
        p + "self_attn.k_proj.weight",
        p + "self_attn.v_proj.weight",
        p + "self_attn.o_proj.weight",
        p + "mlp.gate_proj.weight",
        p + "mlp.up_proj.weight",
        p + "mlp.down_proj.weight",
    ]
    if args.attention_bias or args.qkv_bias:
        names += [p + f"self_attn.{n}_proj.bias" for n in "qkv"]
    if args.attention_bias:
        names.append(p + "self_attn.o_proj.bias")
    return names


def linear_weight_names(args: ModelArgs) -> list[str]:
    """The 2-D weights that compression and quantized formats apply to (lm_head included)."""
    return [n for i in range(args.num_hidden_layers) for n in layer_weight_names(args, i)
            if n.endswith("proj.weight")] + ["lm_head.weight"]


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
}


def unpermute_gguf_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's convert-time row permutation of Q/K (interleaved -> half-split RoPE)."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x: (T, D) -> (T, D); computed in fp32."""
    var = np.mean(np.square(x), axis=-1, keepdims=True)
    return x / np.sqrt(var + eps) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Half-split ("rotate_half") RoPE. x: (T, heads, head_dim); cos/sin: (T, head_dim/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


class LlamaModel:
    """Weights + forward. The KV cache and token bookkeeping belong to the engine."""

    def __init__(self, args: ModelArgs, tensors: dict[str, np.ndarray]):
        self.args = args
        self.embed = tensors["model.embed_tokens.weight"]
        self.norm = tensors["model.norm.weight"]
        self.lm_head = tensors.get("lm_head.weight", self.embed)
        self.layers = [
            {name.split(".", 3)[3]: tensors[name] for name in layer_weight_names(args, i)}
            for i in range(args.num_hidden_layers)
        ]
        inv_freq = rope_inv_freq(args.head_dim, args.rope_theta, args.rope_scaling,
                                 tensors.get("rope_freqs.weight"))
        self.inv_freq = inv_freq.astype(np.float64)
        self.attention_scale = 1.0 / math.sqrt(args.head_dim)

    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight a decode step reads (not the embedding table)."""
        return sum(t.nbytes for layer in self.layers for t in layer.values()) + \
            self.norm.nbytes + self.lm_head.nbytes

    def rope_tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        angles = positions.astype(np.float64)[:, None] * self.inv_freq[None, :]
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def forward(
        self,
        tokens: np.ndarray,
        slots: np.ndarray,
        positions: np.ndarray,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        logit_rows: np.ndarray,
    ) -> np.ndarray:
        """Run a flat batch of T tokens through the model.

        tokens, slots, positions: (T,) int; token t sits at `positions[t]` of the sequence in
        cache slot `slots[t]`; tokens of one slot are contiguous and in position order.
        k_cache, v_cache: (layers, slots, kv_heads, capacity, head_dim), written in place.
        logit_rows: indices into the T tokens whose logits are returned -> (len(logit_rows), vocab).
        """
        a = self.args
        T = tokens.shape[0]
        H, KV, hd = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        cos, sin = self.rope_tables(positions)
        runs = _slot_runs(slots)
        x = self.embed[tokens].astype(np.float32)
        for li, w in enumerate(self.layers):
            h = rms_norm(x, w["input_layernorm.weight"], a.rms_norm_eps)
            q = h @ w["self_attn.q_proj.weight"].T
            k = h @ w["self_attn.k_proj.weight"].T
            v = h @ w["self_attn.v_proj.weight"].T
            if "self_attn.q_proj.bias" in w:
                q += w["self_attn.q_proj.bias"]
                k += w["self_attn.k_proj.bias"]
                v += w["self_attn.v_proj.bias"]
            q = apply_rope(q.reshape(T, H, hd), cos, sin)
            k = apply_rope(k.reshape(T, KV, hd), cos, sin)
            v = v.reshape(T, KV, hd)
            k_cache[li, slots, :, positions] = k
            v_cache[li, slots, :, positions] = v
            attn = np.empty((T, H, hd), dtype=np.float32)
            for slot, start, stop in runs:
                end = positions[stop - 1] + 1
                attn[start:stop] = attention(
                    q[start:stop], k_cache[li, slot, :, :end], v_cache[li, slot, :, :end],
                    positions[start:stop], self.attention_scale, a.sliding_window,
                )
            o = attn.reshape(T, H * hd) @ w["self_attn.o_proj.weight"].T
            if "self_attn.o_proj.bias" in w:
                o += w["self_attn.o_proj.bias"]
            x = x + o
            h = rms_norm(x, w["post_attention_layernorm.weight"], a.rms_norm_eps)
            g = h @ w["mlp.gate_proj.weight"].T
            u = h @ w["mlp.up_proj.weight"].T
            x = x + (silu(g) * u) @ w["mlp.down_proj.weight"].T
        x = rms_norm(x[logit_rows], self.norm, a.rms_norm_eps)
        return (x @ self.lm_head.T).astype(np.float32, copy=False)


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, scale: float,
    sliding_window: int | None = None,
) -> np.ndarray:
    """Causal grouped-query attention for n query tokens of one sequence.

    q: (n, H, hd); k, v: (KV, L, hd) holding positions 0..L-1; positions: (n,) -> (n, H, hd).
    """
    n, H, hd = q.shape
    KV, L, _ = k.shape
    g = H // KV
    qg = q.reshape(n, KV, g, hd).transpose(1, 0, 2, 3).reshape(KV, n * g, hd)
    scores = (qg @ k.transpose(0, 2, 1)) * scale  # (KV, n*g, L)
    keypos = np.arange(L)
    qpos = np.repeat(positions, g)
    masked = keypos[None, :] > qpos[:, None]
    if sliding_window:
        masked |= keypos[None, :] <= qpos[:, None] - sliding_window
    scores[:, masked] = -np.inf
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = p @ v  # (KV, n*g, hd)
    return out.reshape(KV, n, g, hd).transpose(1, 0, 2, 3).reshape(n, H, hd)


def _slot_runs(slots: np.ndarray) -> list[tuple[int, int, int]]:
    """Contiguous runs of equal slot ids -> [(slot, start, stop)]."""
    edges = np.flatnonzero(np.diff(slots)) + 1
    starts = np.concatenate([[0], edges])
    stops = np.concatenate([edges, [len(slots)]])
    return [(int(slots[s]), int(s), int(e)) for s, e in zip(starts, stops, strict=True)]
