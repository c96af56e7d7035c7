"""Engine: owns the model weights and KV cache, runs prefill and decode steps.

Above the engine: token ids and NumPy logits. Below it: the model forward, which takes a flat
batch of tokens with their cache slots and positions: the native runtime (one call per step,
each linear weight in its own packed format) or the NumPy reference on the same weights.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..models import Checkpoint, load_checkpoint
from ..models.decoder import EMBEDDING
from ..progress import progress_bar
from .kv_cache import KVCache
from .memory_check import check_fits
from .native_model import NativeDecoderModel
from .weight_cache import WeightCache, cache_dir_of
from .weights import (
    declared_packed,
    embedding_format,
    embedding_packed,
    native_sources,
    reference_tensors,
    weight_formats,
)

logger = logging.getLogger(__name__)

# Prompt tokens per native step. The GEMMs amortize each weight panel (expanded block) over the
# chunk's tokens: TinyLlama-1.1B 512-token prefill, bf16 92 tok/s in 64-token chunks, 108 in
# 128, 118 in 256, 120 in 512; with the int8 GEMM, 256 -> 512: int8_a8 428 -> 446, int8 373 ->
# 383, int4_g32 320 -> 332. A prompt is prefilled in one call whatever the chunk, so it
# changes no scheduling, only the step's scratch (activations for that many tokens: ~75 MB at
# TinyLlama's shape, ~145 MB at Llama-2-7B's, half that at 256).
DEFAULT_PROMPT_CHUNK = 512
BACKENDS = ("native", "numpy")
# KV-cache element types: fp16 halves the cache's memory and the bytes attention reads per
# step (llama.cpp's default); int8 quarters them (each token's key or value per KV head is
# quantized symmetrically, its scale stored after it: kernels.reference.kv_int8_rows). Keys and
# values are converted as they are written; attention still computes in fp32. Batched decode
# reads the cache of every sequence, so there the bytes show (SmolLM2, 8 sequences of ~100
# tokens: an fp32 cache is ~35 MB read per step next to ~134 MB of int8 weights).
KV_CACHE_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int8": np.int8}


class ContextLengthError(ValueError):
    """A prompt (or prompt + requested tokens) does not fit in the sequence length."""

    def __init__(self, message: str, prompt_tokens: int, limit: int):
        super().__init__(message)
        self.prompt_tokens, self.limit = prompt_tokens, limit


class Engine:
    """Runs a model over sequences held in KV-cache slots.

    `sequence_length` is the per-sequence capacity in tokens (prompt + generated);
    `max_sequences` how many sequences can be active at once (the decode batch size);
    prompts are processed in chunks of `prompt_processing_sequence_length` tokens.

    Each linear weight runs in the format its checkpoint declares (exact stored integers when
    there are some), else in its stored float format (bf16 stays bf16); `weights="int8_a8"`
    (any `sparsellm.kernels.FORMATS` name) converts every linear weight on load instead.
    `backend="numpy"` runs the NumPy reference forward on exactly the weights the native kernels
    would use.
    `num_cores` is this engine's own thread count (None: the process default, all cores unless
    `kernels.set_num_threads` says otherwise): its native calls run on at most that many
    threads, whatever other engines in the process use. The NumPy backend cannot honour it
    (NumPy's threads are process-wide), so it refuses it.
    `kv_cache_dtype="fp16"` or `"int8"` stores keys and values as IEEE half or int8 (see
    KV_CACHE_DTYPES); the NumPy backend keeps fp32 or fp16.
    `dynamic_int8`: weight-only formats quantize their activations to int8 per group of
    columns (int4: its weight group; int8: 32) where an integer kernel then runs faster, as
    llama.cpp and OpenVINO do by default: prompts of int4 (AVX2 and AVX-512) and int8 (AVX-512)
    take an integer GEMM (prefill 3-4x on AVX-512), and on AVX2 dense int4 also decodes and
    verifies speculative tokens that way (`vpmaddubsw` instead of widening nibbles to fp32;
    TinyLlama-1.1B decode 1.3x at group 32, 1.7x at 128). False keeps fp32 activations
    everywhere (weight-only int4 decode on AVX-512 always does). (Prompts' attention runs in
    blocks of 16 queries on AVX-512 either way: fp32, prefill's values up to rounding.)

    Weights the native runtime converts are cached: the first load writes them to
    `weights_cache` (True: $SPARSELLM_CACHE_DIR or ~/.cache/sparsellm; a folder; False: off)
    and later loads of the same files in the same formats map that entry instead of converting
    (engine/weight_cache.py). Before anything is packed, the model's resident size is checked
    against the memory available: a model that cannot fit is a `ModelTooLargeError` naming
    what it needs and what would fit, not an out-of-memory kill.
    """

    def __init__(
        self,
        model: str | Checkpoint,
        sequence_length: int = 1024,
        max_sequences: int = 1,
        prompt_processing_sequence_length: int = DEFAULT_PROMPT_CHUNK,
        num_cores: int | None = None,
        weights: str | None = None,
        backend: str = "native",
        kv_cache_dtype: str = "fp32",
        weights_cache: str | Path | bool = True,
        dynamic_int8: bool = True,
    ):
        self.checkpoint = model if isinstance(model, Checkpoint) else load_checkpoint(model)
        self.args = self.checkpoint.args
        if sequence_length < 1 or prompt_processing_sequence_length < 1 or max_sequences < 1:
            raise ValueError("sequence_length, prompt_processing_sequence_length and "
                             "max_sequences must be positive")
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; accepted: {', '.join(BACKENDS)}")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; accepted: "
                             f"{', '.join(KV_CACHE_DTYPES)}")
        if num_cores is not None and (isinstance(num_cores, bool) or not isinstance(num_cores, int)
                                      or num_cores < 1):
            raise ValueError(f"num_cores must be a positive integer, got {num_cores!r}")
        if num_cores is not None and backend != "native":
            raise ValueError("num_cores needs the native backend: the NumPy reference runs on "
                             "NumPy's own process-wide threads; leave num_cores unset")
        if kv_cache_dtype == "int8" and backend != "native":
            raise ValueError("kv_cache_dtype='int8' needs the native backend; the NumPy "
                             "reference keeps fp32 or fp16 caches")
        positions = self.checkpoint.tensors.get("model.embed_positions.weight")
        if self.args.learned_positions and positions is not None and \
                sequence_length > positions.shape[0]:
            raise ValueError(f"sequence_length {sequence_length} is longer than the "
                             f"{positions.shape[0]} positions this model learned; pass "
                             f"sequence_length <= {positions.shape[0]}")
        self.sequence_length = sequence_length
        self.prompt_chunk = min(prompt_processing_sequence_length, sequence_length)
        self.num_cores = num_cores
        self.backend = backend
        self.dynamic_int8 = dynamic_int8
        # {linear weight name: its format}: `weights` parsed here, specs from here on
        self.specs = weight_formats(self.checkpoint, weights)
        a = self.args
        self.kv_cache_dtype = kv_cache_dtype
        kv_bytes = KVCache.nbytes_for(a.num_hidden_layers, max_sequences, a.num_key_value_heads,
                                      sequence_length, a.head_dim, KV_CACHE_DTYPES[kv_cache_dtype])
        check_fits(self.checkpoint, self.specs, kv_bytes, backend)
        if backend == "native":
            self.model = self._native_model(weights_cache, max(self.prompt_chunk, max_sequences))
        else:
            self.model = self.checkpoint.build_model(reference_tensors(
                self.checkpoint, self.specs, declared_packed(self.checkpoint, self.specs)))
        self.cache = KVCache(a.num_hidden_layers, max_sequences, a.num_key_value_heads,
                             sequence_length, a.head_dim, KV_CACHE_DTYPES[kv_cache_dtype])
        self.vocab_size = a.vocab_size

    def _native_model(self, weights_cache: str | Path | bool, max_tokens: int
                      ) -> NativeDecoderModel:
        """Packed from the converted-weights cache when it has this model in these formats;
        else converted here (and cached when anything was converted)."""
        folder = cache_dir_of(weights_cache)
        ckpt = self.checkpoint
        cache = WeightCache(folder, ckpt.source_files, self.specs) \
            if folder is not None and ckpt.source_files else None
        cached = cache.load() if cache is not None else None
        packed = cached if cached is not None else declared_packed(ckpt, self.specs)
        embed = embedding_packed(ckpt, self.specs)
        with progress_bar(len(self.specs), "packing weights", "weight") as bar:
            model = NativeDecoderModel(
                self.args, native_sources(ckpt, self.specs), self.specs,
                max_tokens=max_tokens, on_packed=lambda: bar.update(1),
                num_threads=self.num_cores, embed_format=embedding_format(ckpt, self.specs),
                packed=packed if embed is None else {**packed, EMBEDDING: embed})
        if cache is not None and cached is None and model.converted and \
                cache.save(model.converted):
            logger.info("converted weights cached in %s", cache.path)
        return model

    # ---- sequences ------------------------------------------------------------------------------
    def add_sequence(self) -> int:
        return self.cache.allocate()

    def release(self, seq: int) -> None:
        self.cache.free(seq)

    def length(self, seq: int) -> int:
        return self.cache.lengths[seq]

    def trim(self, seq: int, length: int) -> None:
        self.cache.trim(seq, length)

    @property
    def max_sequences(self) -> int:
        return self.cache.max_sequences

    @property
    def native_seconds(self) -> float:
        """Wall time spent inside the native forward so far (0 on the NumPy backend): the
        rest of a step is Python (scheduling, sampling, detokenizing)."""
        return self.model.native_seconds if self.backend == "native" else 0.0

    @property
    def num_threads(self) -> int:
        """Threads this engine's native calls run on at most (NumPy backend: the CPU count)."""
        return self.model.num_threads if self.backend == "native" else os.cpu_count() or 1

    @property
    def weight_bytes_per_step(self) -> int:
        """Bytes of weights one decode step reads: every linear weight as stored (the norms and
        the one embedding row per token are negligible)."""
        return self.model.weight_bytes

    @property
    def formats(self) -> dict[str, str]:
        """{linear weight name: the name of its format} (`specs`, named)."""
        return {name: spec.name for name, spec in self.specs.items()}

    @property
    def weights_description(self) -> str:
        """e.g. "sparse_int8_a8 x210, int8_a8 x1" (format x number of linear weights)."""
        counts = Counter(spec.name for spec in self.specs.values())
        return ", ".join(f"{name} x{n}" for name, n in counts.most_common())

    # ---- compute --------------------------------------------------------------------------------
    def prefill(self, seq: int, tokens: list[int], all_logits: bool = False) -> np.ndarray:
        """Append `tokens` to sequence `seq` in chunks.

        Returns logits (len(tokens), vocab) if `all_logits`, else the last token's (1, vocab).
        """
        n = len(tokens)
        if n == 0:
            raise ValueError("prefill needs at least one token")
        self._check_room(seq, n)  # all of it, before any chunk is written
        outs = []
        for start in range(0, n, self.prompt_chunk):
            chunk = tokens[start:start + self.prompt_chunk]
            last_chunk = start + self.prompt_chunk >= n
            if all_logits:
                rows = np.arange(len(chunk))
            else:
                rows = np.array([len(chunk) - 1] if last_chunk else [], dtype=np.int64)
            logits = self.step([seq], [chunk], rows, prompt=True)
            if len(rows):
                outs.append(logits)
        return np.concatenate(outs) if len(outs) > 1 else outs[0]

    def decode_step(self, seqs: list[int], tokens: list[int]) -> np.ndarray:
        """Append one token to each sequence -> logits (len(seqs), vocab)."""
        return self.step(seqs, [[t] for t in tokens], list(range(len(seqs))))

    def step(self, seqs: list[int], tokens: list[list[int]],
             logit_rows: Sequence[int] | np.ndarray, prompt: bool = False) -> np.ndarray:
        """One forward over several sequences, each extended by its own list of tokens.

        logit_rows index the flattened tokens; returns (len(logit_rows), vocab). prompt: the
        tokens are prompt chunks (prefill): on AVX-512 their attention runs in blocks of queries,
        and with `dynamic_int8` weight-only int4 / int8 run their GEMM on quantized activations
        (csrc/include/linear.h). Decode steps and speculative verification are not prompts: a
        token's logits do not depend on what shares its step (up to rounding above the GEMV's
        limit).
        """
        # Plain Python lists, turned into arrays once: run between two native steps, this code
        # finds the CPU caches flushed by the weight stream, where each NumPy call costs ~10 us.
        flat: list[int] = []
        slots: list[int] = []
        positions: list[int] = []
        for s, ts in zip(seqs, tokens, strict=True):
            self._check_room(s, len(ts))
            start = self.cache.lengths[s]
            flat += ts
            slots += [s] * len(ts)
            positions += range(start, start + len(ts))
        if flat and (min(flat) < 0 or max(flat) >= self.vocab_size):
            raise ValueError(f"token id out of range [0, {self.vocab_size})")
        logits = self.model.forward(flat, slots, positions, self.cache.k, self.cache.v,
                                    logit_rows, prompt=prompt, dynamic_int8=self.dynamic_int8)
        for s, ts in zip(seqs, tokens, strict=True):
            self.cache.append(s, len(ts))
        return logits

    def _check_room(self, seq: int, n: int) -> None:
        if self.cache.lengths[seq] + n > self.sequence_length:
            raise ContextLengthError(
                f"sequence needs {self.cache.lengths[seq] + n} tokens but sequence_length is "
                f"{self.sequence_length}",
                self.cache.lengths[seq] + n, self.sequence_length,
            )
