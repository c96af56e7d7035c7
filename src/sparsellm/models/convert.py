"""Shared pieces of architecture files: config.json reading rules and load-time tensor transforms
(renaming to canonical names, splitting fused projections, RoPE layout permutations).

Pure functions on dicts and arrays; no file I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .decoder import ModelArgs

# HF `hidden_act` / `activation_function` values -> decoder activations
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "relu": "relu"}


class UnsupportedConfigError(ValueError):
    """A config.json setting this architecture's implementation does not cover."""


def activation(config: dict[str, Any], key: str, default: str) -> str:
    value = config.get(key) or default
    if value not in _ACTIVATIONS:
        raise UnsupportedConfigError(
            f"config.json {key}={value!r} is not supported; accepted: "
            f"{', '.join(sorted(_ACTIVATIONS))}")
    return _ACTIVATIONS[value]


def refuse(config: dict[str, Any], key: str, ok: Any, why: str) -> None:
    """Raise if config[key] is present and differs from the supported value(s) `ok`."""
    if key not in config or config[key] is None:
        return
    accepted = ok if isinstance(ok, tuple) else (ok,)
    if config[key] not in accepted:
        raise UnsupportedConfigError(
            f"config.json {key}={config[key]!r} is not supported by sparsellm ({why}); "
            f"supported: {', '.join(repr(a) for a in accepted)}")


def rope_settings(config: dict[str, Any], default_theta: float = 10000.0
                  ) -> tuple[float, dict[str, Any] | None, float]:
    """-> (theta, scaling or None, partial_rotary_factor) from transformers >= 5
    `rope_parameters` or the 4.x `rope_theta` / `rope_scaling` / `partial_rotary_factor` keys."""
    theta = config.get("rope_theta", default_theta)
    scaling = config.get("rope_scaling")
    factor = config.get("partial_rotary_factor", 1.0)
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        rope = dict(rope)
        theta = rope.pop("rope_theta", theta)
        factor = rope.pop("partial_rotary_factor", factor)
        scaling = rope if rope.get("rope_type", rope.get("type", "default")) != "default" else None
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return float(theta), scaling, float(factor if factor is not None else 1.0)


def common_args(config: dict[str, Any], **names: str) -> dict[str, Any]:
    """ModelArgs keyword arguments read from config keys: names maps field -> config key."""
    return {f: config[k] for f, k in names.items() if config.get(k) is not None}


def rename(raw: dict[str, np.ndarray], table: dict[str, str], n_layers: int,
           ignored: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """Rename tensors with a template table ("{i}" = layer index). Names matching an `ignored`
    regex (non-weight buffers) are dropped; any other unknown name is an error, so a checkpoint
    variant we do not implement is never loaded half-understood."""
    lookup = expand(table, n_layers)
    out, unknown = {}, []
    for name, arr in raw.items():
        if name in lookup:
            out[lookup[name]] = arr
        elif not any(re.search(p, name) for p in ignored):
            unknown.append(name)
    if unknown:
        raise ValueError(f"unexpected tensors for this architecture: {sorted(unknown)[:5]} "
                         f"({len(unknown)} in all); sparsellm does not implement the variant "
                         "that has them")
    return out


def layer_tensor_names(prefix: str, layer: dict[str, str]) -> dict[str, str]:
    """Template entries for `rename`: the weight and bias of each module in `layer` (source
    name under `prefix` -> canonical name), "{i}" being the layer index."""
    return {f"{prefix}.{{i}}.{src}.{kind}": f"model.layers.{{i}}.{dst}.{kind}"
            for src, dst in layer.items() for kind in ("weight", "bias")}


def expand(table: dict[str, str], n_layers: int) -> dict[str, str]:
    out = {}
    for src, dst in table.items():
        if "{i}" in src:
            for i in range(n_layers):
                out[src.format(i=i)] = dst.format(i=i)
        else:
            out[src] = dst
    return out


def split_fused(t: dict[str, np.ndarray], fused: str, parts: Iterable[tuple[str, int]],
                layers: int) -> None:
    """Replace model.layers.{i}.<fused>.weight/.bias by consecutive row blocks named by
    `parts` ((canonical module, rows), in order)."""
    parts = list(parts)
    for i in range(layers):
        p = f"model.layers.{i}."
        for kind in ("weight", "bias"):
            w = t.pop(f"{p}{fused}.{kind}", None)
            if w is None:
                continue
            start = 0
            for module, rows in parts:
                t[f"{p}{module}.{kind}"] = np.ascontiguousarray(w[start:start + rows])
                start += rows
            assert start == w.shape[0], (fused, start, w.shape)


def split_qkv(t: dict[str, np.ndarray], args: ModelArgs) -> None:
    """Split a fused [all q | all k | all v] self_attn.qkv_proj into q/k/v_proj."""
    q, kv = args.num_attention_heads * args.head_dim, args.num_key_value_heads * args.head_dim
    split_fused(t, "self_attn.qkv_proj", [("self_attn.q_proj", q), ("self_attn.k_proj", kv),
                                          ("self_attn.v_proj", kv)], args.num_hidden_layers)


def group_rows(t: dict[str, np.ndarray], fused: str, outer: int, inner: int,
               layers: int) -> None:
    """Reorder a fused tensor's rows from (outer, inner, rest) to (inner, outer, rest), e.g.
    GPT-NeoX's per-head [q k v] blocks (heads, 3, hd) -> [all q | all k | all v], so that
    split_fused can cut it into consecutive blocks."""
    for i in range(layers):
        for kind in ("weight", "bias"):
            name = f"model.layers.{i}.{fused}.{kind}"
            if name in t:
                w = t[name]
                t[name] = np.ascontiguousarray(
                    w.reshape(outer, inner, -1, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape))


def interleaved_to_half_split(w: np.ndarray, n_heads: int, head_dim: int,
                              rotary_dim: int) -> np.ndarray:
    """Permute the rows of a Q or K projection (weight or bias) so that interleaved RoPE
    (pairs (2j, 2j+1), GPT-J style) becomes half-split RoPE (pairs (j, j + rotary_dim/2)) on
    the first rotary_dim dims of each head. q.k is unchanged when both get the same permutation,
    so the model computes exactly the same attention."""
    perm = np.concatenate([np.arange(0, rotary_dim, 2), np.arange(1, rotary_dim, 2),
                           np.arange(rotary_dim, head_dim)])
    rows = (np.arange(n_heads)[:, None] * head_dim + perm[None, :]).reshape(-1)
    return np.ascontiguousarray(w[rows])


def permute_rope_qk(t: dict[str, np.ndarray], args: ModelArgs) -> None:
    """interleaved_to_half_split on every layer's q/k weights and biases."""
    for i in range(args.num_hidden_layers):
        for n, heads in (("q", args.num_attention_heads), ("k", args.num_key_value_heads)):
            for kind in ("weight", "bias"):
                name = f"model.layers.{i}.self_attn.{n}_proj.{kind}"
                if name in t:
                    t[name] = interleaved_to_half_split(t[name], heads, args.head_dim,
                                                        args.rotary_dim)


def gguf_tensor_names(**overrides: str) -> dict[str, str]:
    """llama.cpp's tensor names (gguf TensorNameMap) -> canonical or fused intermediate names.
    overrides: GGUF short name -> canonical module (e.g. ffn_up="mlp.gate_up_proj", Phi-3)."""
    layer = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_qkv": "self_attn.qkv_proj", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
             "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", **overrides}
    out = {"token_embd.weight": "model.embed_tokens.weight",
           "position_embd.weight": "model.embed_positions.weight"}
    for kind in ("weight", "bias"):
        out[f"output_norm.{kind}"] = f"model.norm.{kind}"
        out[f"output.{kind}"] = f"lm_head.{kind}"
        out.update({f"blk.{{i}}.{src}.{kind}": f"model.layers.{{i}}.{dst}.{kind}"
                    for src, dst in layer.items()})
    return out


def gguf_rope(get: Any, head_dim: int) -> dict[str, Any]:
    """`rope_parameters` (transformers >= 5 form) from GGUF rope metadata."""
    rot = get("rope.dimension_count", head_dim)
    return {"rope_type": "default", "rope_theta": get("rope.freq_base", 10000.0),
            "partial_rotary_factor": rot / head_dim}
