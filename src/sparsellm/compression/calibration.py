"""Sequential one-shot calibration: layer by layer, with the decoder's own NumPy layer forward.

The embedding runs on the calibration samples; then each decoder layer runs through
`DecoderModel.layer` (the same math as inference, for every architecture) with a linear hook:
in execution order ("true sequential"), each group of linears sharing an input (q/k/v, o,
gate/up or up, down) has its input Hessian H = 2 X^T X / n accumulated from the activations
produced by the already compressed weights, is compressed, and is then applied to produce the
next group's input. Memory is bounded by one layer's activations (samples x seq x
max(hidden, intermediate) fp32).
"""

from __future__ import annotations

import logging
import random
import time
from collections import ChainMap
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..models.checkpoint import Checkpoint
from ..models.decoder import DecoderModel, Linears, attention, linear_weight_shape
from ..models.formats import DENSE_FP32, QuantizedTensor, WeightFormat
from ..progress import progress_bar
from ..weight_format import CT_DENSE
from .plan import Plan, Pruned, TensorPlan
from .save import CompressedModel, encode_tensor
from .sparsegpt import accumulate_hessian

logger = logging.getLogger(__name__)

ROW_CHUNK = 8192  # tokens per Hessian accumulation chunk
# The calibration forward and the Hessians run in float64: in float32 the BLAS kernels of
# different CPUs (AVX2 vs AVX-512) round differently, those last-bit differences flip pruning
# and rounding decisions at near-ties, and the flips compound layer by layer (two CPUs gave
# perplexities 0.9% apart). In float64 the same command writes the same weights on either.
CALIBRATION_DTYPE = np.float64


def calibration_samples(
    tokenizer: Any, texts: Sequence[str], num_samples: int, seq_len: int, seed: int = 0,
    progress: bool | None = None,
) -> np.ndarray:
    """(num_samples, seq_len) token ids, deterministic: texts in a seeded shuffled order, each
    contributing at most `seq_len` tokens (so one long file cannot dominate), concatenated and
    cut into chunks. Fewer samples if the texts run out; shorter ones if there is less than one
    chunk."""
    if num_samples < 1 or seq_len < 2:
        raise ValueError("num_calibration_samples must be >= 1 and max_seq_length >= 2")
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    need = num_samples * seq_len
    stream: list[int] = []
    with progress_bar(need, "calibration data", "tok", progress) as bar:
        for i in order:
            text = texts[i]
            if not text.strip():
                continue
            ids = tokenizer.encode(text[: seq_len * 12])[:seq_len]
            stream += ids
            bar.update(min(len(ids), need - bar.n))
            if len(stream) >= need:
                break
    if not stream:
        raise ValueError("the calibration dataset has no text")
    if len(stream) < seq_len:
        return np.asarray([stream], dtype=np.int64)
    n = min(num_samples, len(stream) // seq_len)
    return np.asarray(stream[: n * seq_len], dtype=np.int64).reshape(n, seq_len)


@dataclass
class TensorStats:
    name: str
    shape: tuple[int, int]
    format: str
    sparsity: float
    rel_error: float  # ||(W - W') X|| / ||W X|| over the calibration inputs (or ||W-W'||/||W||)
    error_kind: str  # "output" | "weight"
    seconds: float


@dataclass
class RunResult:
    model: CompressedModel
    stats: list[TensorStats] = field(default_factory=list)
    layer_seconds: dict[str, float] = field(default_factory=dict)


def _rel_error(w: np.ndarray, w_new: np.ndarray, h: np.ndarray | None) -> tuple[float, str]:
    d = (w_new.astype(np.float64) - w)
    if h is None:
        return float(np.linalg.norm(d) / max(np.linalg.norm(w), 1e-30)), "weight"
    num = float(np.sum((d @ h) * d))
    den = float(np.sum((w.astype(np.float64) @ h) * w))
    return float(np.sqrt(max(num, 0.0) / max(den, 1e-30))), "output"


@dataclass
class Compressed:
    """One weight after its plan: the values the model runs, its declared format, and what the
    writer stores (the integers, or the keep mask of float weights)."""

    weight: np.ndarray  # (out, in) fp32 (the dequantized integers when quantized)
    format: WeightFormat
    keep: np.ndarray | None = None  # (out, in) bool, True = kept; None = nothing pruned
    quantized: QuantizedTensor | None = None


def compress_weight(w: np.ndarray, h: np.ndarray | None, plan: TensorPlan) -> Compressed:
    """One weight (out, in) through its plan, given the Hessian h (in, in) of its inputs:
    pruning, then quantization unless the pruning already did it (a joint solve). The steps do
    the work; this knows no modifier."""
    for step in plan.steps:
        if step.needs_hessian and h is None:
            raise ValueError(f"{plan.module.name}: {type(step).__name__} needs calibration "
                             "inputs")
    quant = plan.quant.weight_format(w.shape[1]) if plan.quant else None
    pruned = plan.prune.prune(w, h, quant) if plan.prune else Pruned(w)
    fmt = replace(quant or DENSE_FP32, sparsity=pruned.structure)
    qt = pruned.quantized
    if qt is None and plan.quant is not None:
        qt = plan.quant.quantize(pruned.weight, h, fmt, pruned.keep)
    if qt is None:
        return Compressed(np.asarray(pruned.weight, dtype=np.float32), fmt, pruned.keep)
    return Compressed(qt.dequantize(), qt.format, pruned.keep, qt)


class _CompressingLinears(Linears):
    """The decoder's linear hook during calibration: `prepare` compresses a group of weights
    from their shared input, calls multiply by the (compressed) weights of the run."""

    def __init__(self, compressor: SequentialCompressor):
        self.c = compressor

    def prepare(self, layer: int, modules: Sequence[str], x: np.ndarray) -> None:
        names = [f"model.layers.{layer}.{m}" for m in modules]
        hess = self.c._hessian(x, names)
        for name in names:
            self.c._apply(name, hess)

    def __call__(self, layer: int, module: str, x: np.ndarray) -> np.ndarray:
        return x @ self.c.tensors[f"model.layers.{layer}.{module}.weight"].T


class SequentialCompressor:
    """Runs a Plan over a checkpoint with calibration samples (N, S) token ids."""

    def __init__(self, checkpoint: Checkpoint, plan: Plan, samples: np.ndarray,
                 progress: bool | None = None, sparsity_format: str = CT_DENSE):
        self.ckpt = checkpoint
        self.plan = plan
        self.samples = samples
        self.args = checkpoint.args
        # The compressed weights of the layer being run over the checkpoint's own (read from
        # its files at each access): one layer of fp32 weights is resident at a time, and each
        # finished layer is kept only encoded (its stored integers, bitmasks and scales).
        self.updated: dict[str, np.ndarray] = {}
        self.tensors = ChainMap(self.updated, checkpoint.tensors)
        self.result = RunResult(CompressedModel(checkpoint, self.tensors,
                                                sparsity_format=sparsity_format))
        self.linears = _CompressingLinears(self)
        # Progress in weights compressed, each counted by its size (the work grows with it), so
        # the first weights already give an ETA for the whole run.
        args = checkpoint.args
        total = sum(np.prod(linear_weight_shape(args, n + ".weight")) if n.startswith(
            ("model.layers.", "lm_head")) else args.vocab_size * args.hidden_size
            for n in plan.tensors)
        self.bar = progress_bar(int(total), "compressing", " weights", progress,
                                unit_scale=True)

    # ---- bookkeeping ----------------------------------------------------------------------------
    def _apply(self, module: str, h: np.ndarray | None) -> None:
        tp = self.plan.tensors.get(module)
        if tp is None:
            return
        start = time.perf_counter()
        name = module + ".weight"
        w = np.asarray(self.tensors[name], dtype=np.float32)
        new = compress_weight(w, h, tp)
        self.tensors[name] = new.weight
        out = self.result.model
        out.formats[name] = new.format
        out.zeros[name] = int((new.weight == 0).sum())
        if new.quantized is not None:
            out.quantized[name] = new.quantized
        elif new.keep is not None:
            out.masks[name] = new.keep
        self.bar.update(w.size)
        err, kind = _rel_error(w, new.weight, h)
        self.result.stats.append(TensorStats(
            name, tuple(w.shape), new.format.name, float((new.weight == 0).mean()), err, kind,
            time.perf_counter() - start))

    def _finish(self, prefix: str) -> None:
        """Encode the compressed tensors under `prefix` for the writer and drop their fp32
        values and integers (nothing reads them again)."""
        out = self.result.model
        for name in [n for n in out.formats if n.startswith(prefix) and n not in out.encoded]:
            out.encoded[name] = encode_tensor(out, name)
            out.quantized.pop(name, None)
            out.masks.pop(name, None)
            self.updated.pop(name, None)

    def _hessian(self, x: np.ndarray, modules: Sequence[str]) -> np.ndarray | None:
        """H of x (tokens, in) if any of `modules` needs one (or to measure their error)."""
        if not any(m in self.plan.tensors for m in modules):
            return None
        h, count = None, 0
        for s in range(0, x.shape[0], ROW_CHUNK):
            h, count = accumulate_hessian(h, x[s:s + ROW_CHUNK], count)
        return h

    # ---- run ------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        a = self.args
        embed = "model.embed_tokens"
        self._apply(embed, None)
        # Built after the embedding is compressed; norms and biases are views of self.tensors,
        # linear weights are read through the hook (they change as the run compresses them).
        model = DecoderModel(a, self.tensors)
        n, s = self.samples.shape
        positions = np.tile(np.arange(s), n)
        x = model.embed_tokens(self.samples.reshape(-1), positions,
                               self.tensors[embed + ".weight"]).astype(CALIBRATION_DTYPE)
        rope = model.rope_tables(positions, CALIBRATION_DTYPE)
        attend = self._attend(model, n, s)
        for i in range(a.num_hidden_layers):
            start = time.perf_counter()
            x = model.layer(i, x, rope, attend, self.linears)
            self._finish(f"model.layers.{i}.")
            self.result.layer_seconds[f"model.layers.{i}"] = time.perf_counter() - start
            logger.debug("layer %d compressed in %.1f s", i, time.perf_counter() - start)
        if "lm_head.weight" in self.tensors and "lm_head" in self.plan.tensors:
            start = time.perf_counter()
            hx = model.final_norm(x)
            self._apply("lm_head", self._hessian(hx, ["lm_head"]))
            self.result.layer_seconds["lm_head"] = time.perf_counter() - start
        self._finish("")  # the embedding and lm_head
        self.bar.close()
        return self.result

    def _attend(self, model: DecoderModel, n: int, s: int):
        """Causal attention within each of the n calibration samples of s tokens."""
        a = self.args
        positions = np.arange(s)

        def attend(layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
            out = np.empty((n * s, q.shape[1] * q.shape[2]), dtype=q.dtype)
            for j in range(n):
                rows = slice(j * s, (j + 1) * s)
                out[rows] = attention(q[rows], k[rows].transpose(1, 0, 2),
                                      v[rows].transpose(1, 0, 2), positions,
                                      a.scale, a.window(layer)).reshape(s, -1)
            return out

        return attend
