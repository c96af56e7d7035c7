"""One-shot compression: SparseGPT / magnitude pruning and GPTQ / round-to-nearest quantization,
driven by recipes, calibrated layer by layer, saved as a compressed-tensors HF folder.

    from sparsellm import compress
    compress(model="smollm2-135m-instruct", dataset="python-stdlib", recipe="recipe.yaml",
             output_dir="./smollm2-pruned50-quant", num_calibration_samples=128,
             max_seq_length=512)
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..datasets import DatasetLike
from ..models.checkpoint import Checkpoint
from ..weight_format import CT_DENSE
from .gptq import gptq_quantize
from .magnitude import magnitude_mask, magnitude_prune, nm_mask
from .modifiers import (
    ConstantPruningModifier,
    GPTQModifier,
    MagnitudePruningModifier,
    QuantizationModifier,
    SparseGPTModifier,
)
from .plan import RecipeError, weight_modules
from .quantize import quantize_embedding, rtn_quantize
from .recipe import Recipe, build_plan, parse_recipe
from .sparsegpt import accumulate_hessian, obs_compress, sparsegpt_prune

logger = logging.getLogger(__name__)

__all__ = [
    "CompressionResult", "ConstantPruningModifier", "GPTQModifier", "MagnitudePruningModifier",
    "QuantizationModifier", "Recipe", "RecipeError", "SparseGPTModifier", "accumulate_hessian",
    "compress", "gptq_quantize", "magnitude_mask", "magnitude_prune", "nm_mask", "obs_compress",
    "parse_recipe", "quantize_embedding", "rtn_quantize", "sparsegpt_prune",
]


@dataclass
class CompressionResult:
    output_dir: Path
    report: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return format_summary(self.report)


def compress(
    model: str | Path | Checkpoint,
    dataset: DatasetLike,
    recipe: str | Path | Any,
    output_dir: str | Path,
    num_calibration_samples: int = 128,
    max_seq_length: int = 512,
    *,
    tokenizer: Any = None,
    text_column: str | Sequence[str] | None = None,
    format_data: Callable[[dict], str] | None = None,
    split: str | None = None,
    overwrite: bool = False,
    seed: int = 0,
    progress: bool | None = None,
    sparsity_format: str = CT_DENSE,
) -> CompressionResult:
    """Compress `model` one-shot with `recipe`, calibrated on `dataset`, into `output_dir`.

    model: registry name, GGUF file, HF folder, `hf:org/name` or a loaded Checkpoint.
    dataset: python-stdlib, humaneval, a .txt/.jsonl/.json file, a list of strings or records,
    a loaded Hugging Face Dataset / DatasetDict (`split`, default train), or a Hugging Face
    dataset name in the local cache (`text_column` / `format_data` pick the text). recipe: YAML
    path or string, or modifier objects. `tokenizer` is accepted for SparseML's signature:
    calibration text is tokenized with the model's own tokenizer. The output folder loads with
    `load_checkpoint` / `Pipeline.create`; an existing folder is replaced only with overwrite.
    sparsity_format: how pruned weights are stored, "dense" (zeros in place: loads in
    transformers, vLLM and current compressed-tensors) or "sparse-bitmask" (smaller; read by
    sparsellm and compressed-tensors <= 0.12).
    A progress bar shows on a terminal (`progress` forces it on or off).
    """
    from ..atomic import check_output_dir
    from ..datasets import load_texts
    from ..models import load_checkpoint
    from .calibration import SequentialCompressor, calibration_samples
    from .save import check_sparsity_format, encode_tensors, save_compressed

    check_sparsity_format(sparsity_format)
    start = time.perf_counter()
    parsed = parse_recipe(recipe)
    check_output_dir(output_dir, overwrite)
    texts = load_texts(dataset, text_column=text_column, split=split, format_data=format_data)
    ckpt = model if isinstance(model, Checkpoint) else load_checkpoint(model)
    if ckpt.quantized:
        raise ValueError(f"{ckpt.path} is already quantized; compress a float model (GGUF "
                         "sources are dequantized to fp32 and are fine)")
    args = ckpt.args
    tied = "lm_head.weight" not in ckpt.tensors
    modules = weight_modules(list(ckpt.tensors), args.num_hidden_layers, args.mlp == "gated")
    plan = build_plan(parsed, modules, tied)
    for note in plan.notes:
        logger.info("%s", note)
    samples = calibration_samples(ckpt.tokenizer, texts, num_calibration_samples,
                                  max_seq_length, seed, progress)
    del texts
    calib_start = time.perf_counter()
    run = SequentialCompressor(ckpt, plan, samples, progress, sparsity_format).run()
    calib_seconds = time.perf_counter() - calib_start
    encoded = encode_tensors(run.model)  # once: for the report's sizes and for the file
    sizes = {s.name: sum(int(a.nbytes) for a in encoded[s.name].values()) for s in run.stats}
    report = build_report(run, sizes, samples.shape, plan.notes, calib_seconds)
    report["seconds_total"] = round(time.perf_counter() - start, 2)  # before writing
    out = save_compressed(run.model, output_dir, parsed.to_yaml(), report, overwrite, encoded)
    result = CompressionResult(out, report, plan.notes)
    if progress or (progress is None and sys.stderr.isatty()):
        print(result.summary(), file=sys.stderr)
    return result


def build_report(run: Any, sizes: dict[str, int], shape: tuple[int, ...], notes: list[str],
                 seconds: float) -> dict[str, Any]:
    tensors = []
    for s in run.stats:
        tensors.append({
            "name": s.name, "shape": list(s.shape), "format": s.format,
            "sparsity": round(s.sparsity, 6), "rel_error": round(s.rel_error, 6),
            "error_kind": s.error_kind, "bytes_before": 4 * s.shape[0] * s.shape[1],
            "bytes_after": sizes[s.name], "seconds": round(s.seconds, 3),
        })
    groups: dict[str, list[dict]] = {}
    for t in tensors:
        parts = t["name"].split(".")
        key = ".".join(parts[:3]) if parts[:2] == ["model", "layers"] else t["name"][:-7]
        groups.setdefault(key, []).append(t)
    layers = []
    for key, items in groups.items():
        numel = sum(t["shape"][0] * t["shape"][1] for t in items)
        layers.append({
            "layer": key,
            "sparsity": round(sum(t["sparsity"] * t["shape"][0] * t["shape"][1]
                                  for t in items) / numel, 4),
            "rel_error_mean": round(sum(t["rel_error"] for t in items) / len(items), 5),
            "rel_error_max": round(max(t["rel_error"] for t in items), 5),
            "bytes_before": sum(t["bytes_before"] for t in items),
            "bytes_after": sum(t["bytes_after"] for t in items),
            "seconds": round(run.layer_seconds.get(key, sum(t["seconds"] for t in items)), 2),
        })
    return {
        "calibration": {"samples": int(shape[0]), "seq_len": int(shape[1])},
        "layers": layers,
        "tensors": tensors,
        "bytes_before": sum(t["bytes_before"] for t in tensors),
        "bytes_after": sum(t["bytes_after"] for t in tensors),
        "seconds_calibration": round(seconds, 2),
        "notes": notes,
    }


def format_summary(report: dict[str, Any]) -> str:
    """The per-layer table printed at the end of a run."""
    head = f"{'layer':<22} {'sparsity':>8} {'rel.err':>8} {'max.err':>8} " \
           f"{'MB before':>9} {'MB after':>9} {'time s':>7}"
    lines = [head, "-" * len(head)]
    for row in report["layers"]:
        lines.append(
            f"{row['layer']:<22} {row['sparsity']:>8.1%} {row['rel_error_mean']:>8.4f} "
            f"{row['rel_error_max']:>8.4f} {row['bytes_before'] / 1e6:>9.2f} "
            f"{row['bytes_after'] / 1e6:>9.2f} {row['seconds']:>7.1f}")
    lines.append("-" * len(head))
    before, after = report["bytes_before"], report["bytes_after"]
    lines.append(f"{'compressed weights':<22} {'':>8} {'':>8} {'':>8} {before / 1e6:>9.2f} "
                 f"{after / 1e6:>9.2f} {report.get('seconds_total', 0):>7.1f}")
    cal = report["calibration"]
    lines.append(f"calibration: {cal['samples']} samples x {cal['seq_len']} tokens; "
                 f"size {before / max(after, 1):.2f}x smaller")
    return "\n".join(lines)
