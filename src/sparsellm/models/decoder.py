"""The one decoder-only transformer every architecture is a spec of (math only, no I/O).

An architecture file maps its config.json to `ModelArgs` and its tensor names to the canonical
(Llama-style) names below; this file holds the single NumPy forward over a flat batch of tokens.
The native runtime (csrc/runtime/model.cpp) implements the same spec.

Canonical tensors ("{i}" is the layer index; `?` = present only when the spec says so):
    model.embed_tokens.weight            (vocab, hidden)
    model.embed_positions.weight ?       (max_positions, hidden)  row p = position p
    model.layers.{i}.input_layernorm.weight / .bias ?
    model.layers.{i}.post_attention_layernorm.weight / .bias ?    (not with a shared norm)
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight / .bias ?
    model.layers.{i}.self_attn.{q,k}_norm.weight ?               (head_dim,)  with qk_norm
    model.layers.{i}.{attn,mlp}_output_norm.weight ?             with sandwich_norms
    model.layers.{i}.mlp.gate_proj.weight / .bias ?               (gated MLPs only)
    model.layers.{i}.mlp.{up,down}_proj.weight / .bias ?
    model.norm.weight / .bias ?
    lm_head.weight ? (absent: tied to the embedding) / lm_head.bias ?
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..functional import ACTIVATION_FNS, ACTIVATIONS, apply_rope, attention, layer_norm, rms_norm
from .rope import rope_inv_freq

NORMS = ("rms", "layer")
RESIDUALS = ("sequential", "parallel", "parallel_two_norms")
MLPS = ("gated", "plain")
LAYER_TYPES = ("full_attention", "sliding_attention")
ROW_CHUNK = 8192  # tokens per MLP matmul chunk (bounds (tokens, intermediate) buffers)


@dataclass
class ModelArgs:
    """The decoder spec. Defaults are Llama's."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    norm: str = "rms"  # "rms" | "layer" (LayerNorm with bias)
    norm_eps: float = 1e-6
    # RoPE rotates the first `rotary_dim` dims of each head, half-split ("rotate_half") style;
    # None = all of head_dim, 0 = no RoPE. Interleaved-RoPE checkpoints (GPT-J, CodeGen) are
    # permuted to half-split at load time (see gptj.py), so the runtime has one RoPE.
    rotary_dim: int | None = None
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    learned_positions: bool = False  # add model.embed_positions.weight[position] to the input
    # sequential: x += attn(n1(x)); x += mlp(n2(x))
    # parallel: x += attn(n1(x)) + mlp(n1(x))   (GPT-J, CodeGen, Phi-2: one shared norm)
    # parallel_two_norms: x += attn(n1(x)) + mlp(n2(x))   (GPT-NeoX)
    residual: str = "sequential"
    mlp: str = "gated"  # "gated": down(act(gate(h)) * up(h)); "plain": down(act(up(h)))
    activation: str = "silu"  # silu | gelu_tanh | gelu (erf) | relu
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    lm_head_bias: bool = False
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    # RMSNorm over head_dim of every query and key head (own weights for q and k, the model's
    # norm_eps), after the projections and before RoPE (Qwen3)
    qk_norm: bool = False
    # Per-layer attention (Gemma 3): None = every layer alike (all within sliding_window, or
    # all full); else "full_attention" or "sliding_attention" for each layer
    layer_types: list[str] | None = None
    local_rope_theta: float | None = None  # RoPE base of sliding layers (None: rope_theta)
    attention_scale: float | None = None  # None: 1/sqrt(head_dim)
    embed_scale: float = 1.0  # token embeddings are multiplied by it (Gemma: sqrt(hidden))
    # Norms on the attention and MLP outputs too, before each residual add (Gemma 2/3):
    # x += attn_output_norm(attn(n1(x))); x += mlp_output_norm(mlp(n2(x)))
    sandwich_norms: bool = False
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self) -> None:
        for key in ("hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "vocab_size", "num_key_value_heads", "head_dim",
                    "max_position_embeddings"):
            value = getattr(self, key)
            if value is None and key in ("num_key_value_heads", "head_dim"):
                continue
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        for key, least in (("rope_theta", "positive"), ("norm_eps", "non-negative")):
            value = getattr(self, key)  # (a zero theta makes every RoPE angle infinite)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
                    not math.isfinite(value) or value < 0 or (value == 0 and key == "rope_theta"):
                raise ValueError(f"{key} must be a {least} finite number, got {value!r}")
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.rotary_dim is None:
            self.rotary_dim = self.head_dim
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.rotary_dim % 2 or not 0 <= self.rotary_dim <= self.head_dim:
            raise ValueError(f"rotary_dim ({self.rotary_dim}) must be even and in "
                             f"[0, head_dim={self.head_dim}]")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= \
                    set(LAYER_TYPES):
                raise ValueError(f"layer_types must name one of {', '.join(LAYER_TYPES)} for "
                                 f"each of the {self.num_hidden_layers} layers")
            if "sliding_attention" in self.layer_types and not self.sliding_window:
                raise ValueError("sliding_attention layers need a sliding_window")
        if self.sandwich_norms and self.residual != "sequential":
            raise ValueError("sandwich_norms need the sequential residual")
        for key, value, accepted in (("norm", self.norm, NORMS),
                                     ("residual", self.residual, RESIDUALS),
                                     ("mlp", self.mlp, MLPS),
                                     ("activation", self.activation, ACTIVATIONS)):
            if value not in accepted:
                raise ValueError(f"{key}={value!r} is not supported; accepted: "
                                 f"{', '.join(accepted)}")

    @property
    def shared_norm(self) -> bool:
        return self.residual == "parallel"

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s attention window (None: full causal attention)."""
        if self.layer_types is None or self.layer_types[layer] == "sliding_attention":
            return self.sliding_window or None
        return None

    def local_rope(self, layer: int) -> bool:
        """Whether layer `layer` rotates with local_rope_theta (a sliding layer, when set)."""
        return self.local_rope_theta is not None and self.window(layer) is not None

    @property
    def scale(self) -> float:
        """Attention score scale."""
        return self.attention_scale or 1.0 / math.sqrt(self.head_dim)


def layer_weight_names(args: ModelArgs, i: int) -> list[str]:
    """Canonical names of layer i's tensors."""
    p = f"model.layers.{i}."
    norms = ["input_layernorm"] + ([] if args.shared_norm else ["post_attention_layernorm"])
    names = [p + n + ".weight" for n in norms]
    if args.norm == "layer":
        names += [p + n + ".bias" for n in norms]
    names += [p + f"self_attn.{n}_proj.weight" for n in "qkvo"]
    if args.qk_norm:
        names += [p + f"self_attn.{n}_norm.weight" for n in "qk"]
    if args.sandwich_norms:
        names += [p + f"{n}_output_norm.weight" for n in ("attn", "mlp")]
    if args.qkv_bias:
        names += [p + f"self_attn.{n}_proj.bias" for n in "qkv"]
    if args.o_bias:
        names.append(p + "self_attn.o_proj.bias")
    mlp = ["gate_proj", "up_proj", "down_proj"] if args.mlp == "gated" else ["up_proj", "down_proj"]
    names += [p + f"mlp.{n}.weight" for n in mlp]
    if args.mlp_bias:
        names += [p + f"mlp.{n}.bias" for n in mlp]
    return names


def linear_weight_names(args: ModelArgs) -> list[str]:
    """The 2-D weights that compression and quantized formats apply to (lm_head included)."""
    return [n for i in range(args.num_hidden_layers) for n in layer_weight_names(args, i)
            if n.endswith("proj.weight")] + ["lm_head.weight"]


EMBEDDING = "model.embed_tokens.weight"  # the token embedding table (a tied lm_head's weights)


def linear_weight_shape(args: ModelArgs, name: str) -> tuple[int, int]:
    """(out, in) of a linear weight, from the spec alone (nothing read)."""
    D, I = args.hidden_size, args.intermediate_size
    q, kv = args.num_attention_heads * args.head_dim, args.num_key_value_heads * args.head_dim
    shapes = {"q_proj": (q, D), "k_proj": (kv, D), "v_proj": (kv, D), "o_proj": (D, q),
              "gate_proj": (I, D), "up_proj": (I, D), "down_proj": (D, I),
              "lm_head": (args.vocab_size, D)}
    return shapes[name.split(".")[-2]]


def tensor_shape(args: ModelArgs, name: str) -> tuple[int, ...] | None:
    """The shape the spec gives a canonical tensor (None: a name it does not fix, e.g. learned
    positions, whose count a checkpoint decides, or RoPE frequency divisors)."""
    D, vocab = args.hidden_size, args.vocab_size
    if name in (EMBEDDING, "lm_head.weight"):
        return (vocab, D)
    if name == "lm_head.bias":
        return (vocab,)
    if name in ("model.norm.weight", "model.norm.bias"):
        return (D,)
    if not name.startswith("model.layers."):
        return None
    module, kind = name.split(".")[-2:]
    if module.endswith("_proj"):
        out, cols = linear_weight_shape(args, name)
        return (out, cols) if kind == "weight" else (out,)
    if module in ("q_norm", "k_norm"):
        return (args.head_dim,)
    if module in ("input_layernorm", "post_attention_layernorm", "attn_output_norm",
                  "mlp_output_norm"):
        return (D,)
    return None


# ---- the model ----------------------------------------------------------------------------------
class Linears:
    """How a layer applies its linear weights. The default multiplies by the model's weights;
    calibration subclasses it to compress each weight from its input before it is applied.

    `prepare` is called once with the full input of each group of linears sharing it (before
    any of them runs, possibly in row chunks); `__call__` returns x @ W.T without the bias."""

    def __init__(self, layers: Sequence[dict[str, np.ndarray]]):
        self.layers = layers

    def prepare(self, layer: int, modules: Sequence[str], x: np.ndarray) -> None:
        pass

    def __call__(self, layer: int, module: str, x: np.ndarray) -> np.ndarray:
        return x @ self.layers[layer][module + ".weight"].T


# (cos, sin) of the global RoPE, then of the local one (DecoderModel.rope_tables)
Rope = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
# attend(layer, q (T, H, hd), k (T, KV, hd), v (T, KV, hd)) -> (T, H * hd); RoPE already applied
Attend = Callable[[int, np.ndarray, np.ndarray, np.ndarray], np.ndarray]


class _LayerTensors(Mapping[str, np.ndarray]):
    """Layer i's tensors under their names within the layer ("mlp.up_proj.weight"), looked
    up in the model's mapping at each access."""

    def __init__(self, tensors: Mapping[str, np.ndarray], args: ModelArgs, i: int):
        self._tensors, self._prefix = tensors, f"model.layers.{i}."
        self._names = dict.fromkeys(n[len(self._prefix):] for n in layer_weight_names(args, i))

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise KeyError(name)
        return self._tensors[self._prefix + name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class DecoderModel:
    """Weights + forward. The KV cache and token bookkeeping belong to the engine."""

    def __init__(self, args: ModelArgs, tensors: Mapping[str, np.ndarray]):
        """tensors: canonical names -> fp32 arrays. Layer tensors are looked up in it when a
        layer runs (a lazy mapping is never read whole: calibration runs a 7B model this way)."""
        self.args = args
        self.embed = tensors["model.embed_tokens.weight"]
        self.pos_embed = tensors["model.embed_positions.weight"] if args.learned_positions \
            else None
        self.norm = tensors["model.norm.weight"]
        self.norm_bias = tensors.get("model.norm.bias")
        self.lm_head = tensors.get("lm_head.weight", self.embed)
        self.lm_head_bias = tensors["lm_head.bias"] if args.lm_head_bias else None
        self.layers = [_LayerTensors(tensors, args, i) for i in range(args.num_hidden_layers)]
        self.inv_freq = rope_inv_freq(args.rotary_dim, args.rope_theta, args.rope_scaling,
                                      tensors.get("rope_freqs.weight"))
        self.local_inv_freq = None if args.local_rope_theta is None else \
            rope_inv_freq(args.rotary_dim, args.local_rope_theta)
        self.linears = Linears(self.layers)

    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight a decode step reads (not the embedding tables)."""
        return sum(t.nbytes for layer in self.layers for t in layer.values()) + \
            self.norm.nbytes + self.lm_head.nbytes

    def rope_tables(self, positions: np.ndarray, dtype: type = np.float32) -> Rope:
        """-> (cos, sin) of the global RoPE and of the local one (sliding layers with their
        own base; else the global one again), each (T, rotary_dim / 2)."""
        def tables(inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
            return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)

        glob = tables(self.inv_freq)
        return glob, glob if self.local_inv_freq is None else tables(self.local_inv_freq)

    def embed_tokens(self, tokens: np.ndarray, positions: np.ndarray,
                     embed: np.ndarray | None = None) -> np.ndarray:
        """(T,) ids at (T,) positions -> (T, hidden) fp32 (embed: another token table)."""
        x = (self.embed if embed is None else embed)[tokens].astype(np.float32)
        if self.args.embed_scale != 1.0:
            x *= np.float32(self.args.embed_scale)
        if self.pos_embed is not None:
            if positions.size and positions.max() >= self.pos_embed.shape[0]:
                raise IndexError(f"position {int(positions.max())} beyond the "
                                 f"{self.pos_embed.shape[0]} learned positions")
            x += self.pos_embed[positions]
        return x

    def _norm(self, x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
        if self.args.norm == "rms":
            return rms_norm(x, w[name + ".weight"], self.args.norm_eps)
        return layer_norm(x, w[name + ".weight"], w.get(name + ".bias"), self.args.norm_eps)

    def final_norm(self, x: np.ndarray) -> np.ndarray:
        return self._norm(x, {"n.weight": self.norm, "n.bias": self.norm_bias}, "n")

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Final norm + lm_head: (R, hidden) -> (R, vocab)."""
        out = self.final_norm(x) @ self.lm_head.T
        if self.lm_head_bias is not None:
            out += self.lm_head_bias
        return softcap(out.astype(np.float32, copy=False), self.args.final_logit_softcap)

    def layer(self, i: int, x: np.ndarray, rope: Rope, attend: Attend,
              linears: Linears | None = None) -> np.ndarray:
        """Decoder layer i: x (T, hidden) -> (T, hidden); rope: this batch's rope_tables."""
        a = self.args
        w = self.layers[i]
        lin = linears or self.linears

        def linear(module: str, inp: np.ndarray) -> np.ndarray:
            y = lin(i, module, inp)
            b = w.get(module + ".bias")
            return y if b is None else y + b

        T = x.shape[0]
        H, KV, hd = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        h = self._norm(x, w, "input_layernorm")
        qkv = [f"self_attn.{n}_proj" for n in "qkv"]
        lin.prepare(i, qkv, h)
        cos, sin = rope[a.local_rope(i)]
        q = linear(qkv[0], h).reshape(T, H, hd)
        k = linear(qkv[1], h).reshape(T, KV, hd)
        if a.qk_norm:
            q = rms_norm(q, w["self_attn.q_norm.weight"], a.norm_eps)
            k = rms_norm(k, w["self_attn.k_norm.weight"], a.norm_eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = linear(qkv[2], h).reshape(T, KV, hd)
        att = attend(i, q, k, v)
        del q, k, v
        lin.prepare(i, ["self_attn.o_proj"], att)
        att = linear("self_attn.o_proj", att)
        if a.residual == "sequential":
            if a.sandwich_norms:
                att = self._norm(att, w, "attn_output_norm")
            x = x + att
            del att
            h = self._norm(x, w, "post_attention_layernorm")
            out = self._mlp(i, h, lin, linear)
            return x + (self._norm(out, w, "mlp_output_norm") if a.sandwich_norms else out)
        if a.residual == "parallel_two_norms":
            h = self._norm(x, w, "post_attention_layernorm")
        return x + att + self._mlp(i, h, lin, linear)

    def _mlp(self, i: int, h: np.ndarray, lin: Linears,
             linear: Callable[[str, np.ndarray], np.ndarray]) -> np.ndarray:
        a = self.args
        act_fn = ACTIVATION_FNS[a.activation]
        first = ["mlp.gate_proj", "mlp.up_proj"] if a.mlp == "gated" else ["mlp.up_proj"]
        lin.prepare(i, first, h)
        act = np.empty((h.shape[0], a.intermediate_size), dtype=h.dtype)
        for r in range(0, h.shape[0], ROW_CHUNK):
            hr = h[r:r + ROW_CHUNK]
            if a.mlp == "gated":
                act[r:r + ROW_CHUNK] = act_fn(linear("mlp.gate_proj", hr)) * \
                    linear("mlp.up_proj", hr)
            else:
                act[r:r + ROW_CHUNK] = act_fn(linear("mlp.up_proj", hr))
        lin.prepare(i, ["mlp.down_proj"], act)
        out = np.empty_like(h)
        for r in range(0, h.shape[0], ROW_CHUNK):
            out[r:r + ROW_CHUNK] = linear("mlp.down_proj", act[r:r + ROW_CHUNK])
        return out

    def forward(
        self,
        tokens: Sequence[int] | np.ndarray,
        slots: Sequence[int] | np.ndarray,
        positions: Sequence[int] | np.ndarray,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        logit_rows: Sequence[int] | np.ndarray,
        prompt: bool = False,
        dynamic_int8: bool = True,
    ) -> np.ndarray:
        """Run a flat batch of T tokens through the model.

        tokens, slots, positions: (T,) ints (lists or arrays); token t sits at `positions[t]` of
        the sequence in cache slot `slots[t]`; tokens of one slot are contiguous and in position
        order.
        k_cache, v_cache: (layers, slots, kv_heads, capacity, head_dim), written in place.
        logit_rows: indices into the T tokens whose logits are returned -> (len(logit_rows), vocab).
        prompt, dynamic_int8: the tokens are prompt chunks (the native model may then run its
        prompt kernels: blocked attention and, with dynamic_int8, the int8 GEMM on quantized
        activations; this one computes in fp32 either way).
        """
        a = self.args
        tokens, slots, positions, logit_rows = (np.asarray(x, dtype=np.int64) for x in (
            tokens, slots, positions, logit_rows))
        T = tokens.shape[0]
        runs = _slot_runs(slots)

        def attend(li: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
            k_cache[li, slots, :, positions] = k
            v_cache[li, slots, :, positions] = v
            out = np.empty(q.shape, dtype=np.float32)
            for slot, start, stop in runs:
                end = positions[stop - 1] + 1
                out[start:stop] = attention(
                    q[start:stop], k_cache[li, slot, :, :end], v_cache[li, slot, :, :end],
                    positions[start:stop], a.scale, a.window(li),
                )
            return out.reshape(T, -1)

        rope = self.rope_tables(positions)
        x = self.embed_tokens(tokens, positions)
        for li in range(a.num_hidden_layers):
            x = self.layer(li, x, rope, attend)
        return self.logits(x[logit_rows])


def softcap(logits: np.ndarray, cap: float | None) -> np.ndarray:
    """cap * tanh(logits / cap) (Gemma 2's final logit soft cap), in place; logits if None."""
    if cap:
        logits /= np.float32(cap)
        np.tanh(logits, out=logits)
        logits *= np.float32(cap)
    return logits


def _slot_runs(slots: np.ndarray) -> list[tuple[int, int, int]]:
    """Contiguous runs of equal slot ids -> [(slot, start, stop)]."""
    edges = np.flatnonzero(np.diff(slots)) + 1
    starts = np.concatenate([[0], edges])
    stops = np.concatenate([edges, [len(slots)]])
    return [(int(slots[s]), int(s), int(e)) for s, e in zip(starts, stops, strict=True)]
