"""export(): a self-contained deployment folder, as SparseML users know it.

    from sparsellm import export
    export("./smollm2-pruned50-quant", task="text-generation", sequence_length=1024,
           target_path="./exported")      # -> ./exported/deployment/

The deployment folder holds everything the runtime needs (config.json with the compressed-tensors
formats, safetensors, tokenizer and generation files, the recipe and compression report) plus
`deployment.json` recording the task and sequence length, which `Pipeline.create` /
`sparsellm serve` use as their default. Its tokenizer_config.json carries the same
`model_max_length`, so Hugging Face tokenizers loaded from it agree. A compressed HF folder is
copied file by file (nothing is re-encoded); a GGUF or registry model is written as an fp32 HF
folder. The folder is written atomically.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .atomic import atomic_folder, write_json_atomic
from .models import Checkpoint, load_checkpoint
from .models.checkpoint import DEPLOYMENT_FILE, PICKLE_SUFFIXES
from .pipeline import TEXT_GENERATION_TASKS

__all__ = ["export"]


def export(
    model: str | Path | Checkpoint,
    task: str = "text-generation",
    sequence_length: int | None = None,
    target_path: str | Path = "./deployment",
    overwrite: bool = False,
) -> Path:
    """Write `target_path`/deployment for `model` (registry name, GGUF file, HF or compressed
    folder, `hf:org/name`, or a loaded Checkpoint) -> the deployment folder's path.
    sequence_length defaults to 1024, or the model's max_position_embeddings if shorter."""
    if task.lower() not in TEXT_GENERATION_TASKS:
        raise ValueError(f"unknown task {task!r}; supported: {', '.join(TEXT_GENERATION_TASKS)}")
    ckpt = model if isinstance(model, Checkpoint) else load_checkpoint(model)
    limit = ckpt.args.max_position_embeddings
    if sequence_length is None:
        sequence_length = min(1024, limit)
    if not isinstance(sequence_length, int) or sequence_length < 1:
        raise ValueError(f"sequence_length must be a positive integer, got {sequence_length!r}")
    if sequence_length > limit:
        raise ValueError(f"sequence_length {sequence_length} is longer than the model's "
                         f"max_position_embeddings ({limit})")
    target = Path(target_path).expanduser() / "deployment"
    with atomic_folder(target, overwrite) as tmp:
        if ckpt.format == "safetensors":
            _copy_model_files(ckpt.path, tmp)
        else:  # GGUF: dequantized tensors become an fp32 HF folder
            from .compression.save import CompressedModel, write_model_files

            write_model_files(CompressedModel(ckpt, ckpt.tensors), tmp)
        tok_config = tmp / "tokenizer_config.json"
        config = json.loads(tok_config.read_text()) if tok_config.is_file() else {}
        write_json_atomic(tok_config, {**config, "model_max_length": sequence_length})
        write_json_atomic(tmp / DEPLOYMENT_FILE, {
            "task": "text-generation", "sequence_length": sequence_length,
            "source": str(ckpt.path),
        })
    return target.absolute()


def _copy_model_files(source: Path, folder: Path) -> None:
    """Every file of an HF folder but pickles, hidden files and an older deployment.json."""
    for f in sorted(source.iterdir()):
        if f.is_file() and not f.name.startswith(".") and f.suffix not in PICKLE_SUFFIXES \
                and f.name != DEPLOYMENT_FILE:
            shutil.copy2(f, folder / f.name)
