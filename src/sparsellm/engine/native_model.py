"""NativeDecoderModel: the whole decoder forward (any architecture spec) as one native call per
step.

A drop-in for `sparsellm.models.decoder.DecoderModel` where the engine runs a model: built from the
same `ModelArgs` + canonical tensors dict, `forward` takes the same arguments and returns the
same logits. Each linear weight is packed in the format chosen for it (any mix), e.g.

    formats = {name: "sparse_int8_a8" for name in linear_weight_names(args)}
    formats["lm_head.weight"] = "int8_a8"
    model = NativeDecoderModel(args, tensors, formats, masks=masks)
    logits = model.forward(tokens, slots, positions, k_cache, v_cache, logit_rows)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..kernels import reference
from ..kernels._ext import native
from ..kernels.formats import FormatSpec, PackedWeight, as_spec, float_format, pack
from ..kernels.memory import gather, release_freed_heap
from ..kernels.ops import get_num_threads
from ..models.decoder import EMBEDDING, ModelArgs, linear_weight_names
from ..models.rope import rope_inv_freq

# _native.LayerWeights field -> canonical name suffix inside "model.layers.{i}."
_LINEAR = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
           "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
           "down": "mlp.down_proj"}
# _native.LayerWeights vector -> fp32 tensor name suffix (absent ones are passed as None)
_VECTORS = {"attn_norm": "input_layernorm.weight", "attn_norm_b": "input_layernorm.bias",
            "mlp_norm": "post_attention_layernorm.weight",
            "mlp_norm_b": "post_attention_layernorm.bias",
            "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
            "attn_out_norm": "attn_output_norm.weight", "mlp_out_norm": "mlp_output_norm.weight",
            **{f"b{k}": f"{base}.bias" for k, base in _LINEAR.items()}}


class NativeDecoderModel:
    """Packed weights + a native forward over a flat batch of tokens (see DecoderModel.forward)."""

    def __init__(
        self,
        args: ModelArgs,
        tensors: Mapping[str, np.ndarray],
        formats: str | FormatSpec | Mapping[str, str | FormatSpec] = "fp32",
        *,
        masks: Mapping[str, np.ndarray] | None = None,
        packed: Mapping[str, PackedWeight] | None = None,
        max_tokens: int = 512,
        on_packed: Callable[[], object] | None = None,
        num_threads: int | None = None,
        embed_format: str | FormatSpec | None = None,
    ):
        """formats: one format for every linear weight, or {canonical name: format} (names missing
        from the dict stay fp32), each a name or a `FormatSpec`. masks: {name: kept-weights bool
        mask} for sparse formats (default: the weight's nonzeros). packed: already packed weights
        (e.g. exact integers from a compressed checkpoint), used as they are. max_tokens: largest
        number of tokens per native call; longer batches are split into chunks. on_packed: called
        after each linear weight is packed (progress). num_threads: this model's own thread count,
        for packing and for every forward (None: the process default, `set_num_threads`); another
        model in the same process may use a different one, even at the same time. embed_format: the
        format token lookups decode the embedding table from (None: the float format it is stored
        in); a tied lm_head in that format is the same packed weight (engine/weights.py
        embedding_format)."""
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be at least 1, got {num_threads}")
        self._threads = num_threads
        self.args = args
        self.max_tokens = int(max_tokens)
        self.native_seconds = 0.0  # wall time inside the native forward, over all calls
        masks = masks or {}
        packed = dict(packed or {})
        names = linear_weight_names(args)
        if isinstance(formats, str | FormatSpec):
            formats = dict.fromkeys(names, formats)
        unknown = set(formats) - set(names)
        if unknown:
            raise ValueError(f"formats given for unknown weights {sorted(unknown)[:3]}; "
                             f"linear weights are e.g. {names[0]!r}, 'lm_head.weight'")
        fp32 = as_spec("fp32")
        specs = {name: as_spec(formats[name]) if name in formats else fp32 for name in names}
        # Weights packed as the caller's own arrays (fp32, or bf16/fp16 as stored: views of a
        # memory-mapped file) stay where they are, and so do given packed weights that are views
        # of a read-only file mapping (a converted-weights cache entry); the rest move into one
        # huge-page block.
        in_place = {id(w) for w in packed.values() if not w.arrays["data"].flags.writeable}

        def pack_from(w: np.ndarray, fmt: FormatSpec, mask: np.ndarray | None = None
                      ) -> PackedWeight:
            p = pack(w, fmt, mask)
            if np.may_share_memory(p.arrays["data"], w):
                in_place.add(id(p))
            return p

        # The embedding table runs in the float format it is stored in, or in embed_format
        # (rows are decoded at lookup); a tied lm_head in that same format is the same packed
        # weight.
        stored_embed = tensors[EMBEDDING]
        embed_fmt = as_spec(embed_format) if embed_format else float_format(stored_embed.dtype)
        head = packed.get("lm_head.weight")
        embed = packed.pop(EMBEDDING, None)  # given packed (exact integers), else:
        if embed is not None:
            pass
        elif "lm_head.weight" not in tensors and head is not None and head.spec == embed_fmt:
            embed = head
        else:
            embed = pack_from(stored_embed, embed_fmt)

        def pack_one(name: str) -> PackedWeight:
            fmt = specs[name]
            if name in packed:
                p = packed[name]
            elif name == "lm_head.weight" and name not in tensors:
                p = embed if fmt == embed.spec else pack_from(stored_embed, fmt)
            else:
                p = pack_from(tensors[name], fmt, masks.get(name))
                release_freed_heap()  # the conversion's temporaries, before the next tensor's
            if on_packed is not None:
                on_packed()
            return p

        # Converting is NumPy work that releases the GIL: one tensor per thread, so at most
        # that many tensors are in flight (the working set stays bounded).
        with ThreadPoolExecutor(max_workers=self.num_threads) as pool:
            self.packed: dict[str, PackedWeight] = dict(zip(names, pool.map(pack_one, names),
                                                            strict=True))
        self.embed = embed  # the table token lookups decode rows of
        moved = {id(w): w for w in [*self.packed.values(), embed] if id(w) not in in_place}
        gather(moved.values())
        # What this model converted or was given fresh (not views of the caller's memory or of
        # a file): what a converted-weights cache keeps.
        self.converted = {name: w for name, w in self.packed.items() if id(w) in moved}

        def vec(name: str) -> np.ndarray | None:  # aligned: a file's view may not be
            t = tensors.get(name)
            return None if t is None else np.require(t, np.float32, ["C", "A"])

        layers = []
        for i in range(args.num_hidden_layers):
            p = f"model.layers.{i}."
            layer = native().LayerWeights()  # the typed C++ struct (csrc/include/model.h)
            for key, base in _LINEAR.items():
                if p + base + ".weight" in self.packed:
                    setattr(layer, key, self.packed[p + base + ".weight"].native())
            for key, name in _VECTORS.items():
                setattr(layer, key, vec(p + name))
            layers.append(layer)
        inv_freq = rope_inv_freq(args.rotary_dim, args.rope_theta, args.rope_scaling,
                                 tensors.get("rope_freqs.weight"))
        pos_embed = vec("model.embed_positions.weight") if args.learned_positions else None
        config = native().ModelConfig()  # the spec as the typed C++ struct (csrc/include/model.h)
        config.hidden, config.intermediate = args.hidden_size, args.intermediate_size
        config.layers = args.num_hidden_layers
        config.heads, config.kv_heads = args.num_attention_heads, args.num_key_value_heads
        config.head_dim, config.vocab = args.head_dim, args.vocab_size
        config.eps = float(args.norm_eps)
        config.sliding_window = int(args.sliding_window or 0)
        config.max_tokens = self.max_tokens
        config.rotary_dim = args.rotary_dim
        config.inv_freq = [float(f) for f in np.asarray(inv_freq, dtype=np.float64)]
        config.layer_norm = args.norm == "layer"
        config.residual = native().Residual.__members__[args.residual]
        config.gated = args.mlp == "gated"
        config.act = native().Activation.__members__[args.activation]
        config.max_positions = 0 if pos_embed is None else pos_embed.shape[0]
        config.qk_norm = args.qk_norm
        if args.layer_types is not None:
            config.layer_sliding = [args.window(i) is not None
                                    for i in range(args.num_hidden_layers)]
        if args.local_rope_theta is not None:
            config.local_inv_freq = [float(f) for f in rope_inv_freq(args.rotary_dim,
                                                                     args.local_rope_theta)]
        config.attn_scale = args.scale
        config.embed_scale = args.embed_scale
        config.sandwich_norms = args.sandwich_norms
        config.final_logit_softcap = args.final_logit_softcap or 0.0
        self._tensors = tensors
        self._model = native().NativeModel(
            config, layers, embed.native(), pos_embed, vec("model.norm.weight"),
            vec("model.norm.bias"),
            self.packed["lm_head.weight"].native(),
            vec("lm_head.bias") if args.lm_head_bias else None)
        self._model.num_threads = num_threads or 0  # applied by the native forward itself

    @property
    def num_threads(self) -> int:
        """Threads a forward runs on at most: this model's count, else the process default."""
        return self._threads or max(1, get_num_threads())

    @property
    def last_threads(self) -> int:
        """Most threads that ran one parallel region of the last forward (measured by the
        pool; fewer than num_threads while another thread's forward holds the pool)."""
        return int(self._model.last_threads)

    @property
    def weight_bytes(self) -> int:
        """Packed bytes of all linear weights: what one decode step streams from memory."""
        return sum(p.nbytes for p in self.packed.values())

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
        """Same contract as DecoderModel.forward; k_cache/v_cache (layers, slots, kv_heads,
        capacity, head_dim), C-contiguous float32 or float16, are written in place. prompt: the
        tokens are prompt chunks: on AVX-512 their attention runs in blocks of queries, and with
        dynamic_int8 weight-only formats may quantize their activations for the int8 GEMM
        (csrc/include/linear.h). -> (len(logit_rows), vocab)
        """
        out = np.empty((len(logit_rows), self.args.vocab_size), dtype=np.float32)
        T, M = len(tokens), self.max_tokens
        if T <= M:  # lists of ints go to the native call as they are (no NumPy on this path)
            self._native_forward(tokens, slots, positions, k_cache, v_cache, logit_rows, out,
                                 prompt, dynamic_int8)
            return out
        # Chunks run in order, so a later chunk sees the keys/values the earlier ones wrote.
        # They are near-equal in size, never M, M, ..., and a remainder: a remainder of a few
        # tokens would take the GEMV path, whose last bits differ from the GEMM's that the same
        # tokens get in a larger call, so a token's logits would depend on how the step's
        # tokens were grouped (a perplexity window, or a Ray worker's share of them).
        tokens, slots, positions, rows = (np.asarray(a, dtype=np.int64)
                                          for a in (tokens, slots, positions, logit_rows))
        n = -(-T // M)
        for i in range(n):
            c0, c1 = T * i // n, T * (i + 1) // n
            sel = np.flatnonzero((rows >= c0) & (rows < c1))
            part = np.empty((sel.size, self.args.vocab_size), dtype=np.float32)
            self._native_forward(tokens[c0:c1], slots[c0:c1], positions[c0:c1], k_cache,
                                 v_cache, rows[sel] - c0, part, prompt, dynamic_int8)
            out[sel] = part
        return out

    def _native_forward(self, *args: Sequence[int] | np.ndarray | bool) -> None:
        start = time.perf_counter()
        self._model.forward(*args)
        self.native_seconds += time.perf_counter() - start

    def dequantized_tensors(self) -> dict[str, np.ndarray]:
        """The tensors dict with every linear weight replaced by what the kernels multiply by
        (for DecoderModel reference runs and quality checks)."""
        return reference.with_dequantized(self._tensors, self.packed)
