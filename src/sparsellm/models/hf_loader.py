"""HF model folders (config.json + *.safetensors + tokenizer files) -> Checkpoint, including
compressed-tensors folders (their stored forms decoded by compressed.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import numpy as np

from ..dtypes import as_float32, is_float
from ..tokenizer import Tokenizer
from .architectures import find_architecture
from .checkpoint import (
    DEPLOYMENT_FILE,
    PICKLE_SUFFIXES,
    TENSOR_NAMES_KEY,
    Checkpoint,
    check_tensors,
    pickle_refusal,
)
from .compressed import decode_compressed_tensors, is_compressed_config
from .formats import QuantizedTensor, WeightFormat
from .lazy import LazyTensors, transform_each
from .safetensors_io import SafetensorsFile

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"


def load_hf_folder(folder: Path) -> Checkpoint:
    """An HF model folder: config.json, *.safetensors (sharded or not), tokenizer files; plain
    float weights (mapped, converted to canonical names by the architecture) or
    compressed-tensors ones (decoded by compressed.py into fp32 values, declared formats and
    their exact integers)."""
    config = json.loads((folder / CONFIG_FILE).read_text())
    names = config.get("architectures") or [config.get("model_type", "?")]
    arch = find_architecture(names[0])
    paths = _safetensors_files(folder)
    files = [SafetensorsFile(f) for f in paths]
    raw = LazyTensors({name: partial(f.__getitem__, name) for f in files for name in f})
    copies = LazyTensors({name: partial(f.read, name) for f in files for name in f})
    stored, dtypes = None, {}
    formats: dict[str, WeightFormat] = {}
    quantized: Mapping[str, QuantizedTensor] = {}
    args = arch.args(config)
    canonical = config.get(TENSOR_NAMES_KEY) == "canonical"
    if is_compressed_config(config):  # compressed-tensors: integers, bitmasks, declared formats
        if not (canonical or arch.canonical_hf_names):
            raise ValueError(
                f"{folder}: compressed-tensors checkpoints of {names[0]} are supported as "
                "sparsellm writes them (canonical tensor names); compress the float model with "
                "`sparsellm compress` instead")
        tensors, formats, quantized, notes = decode_compressed_tensors(
            transform_each(copies, _float32_tensor), config)
        for note in notes:
            logger.info("%s: %s", folder, note)
        # Tensors stored as plain floats (norms, an unquantized embedding or lm_head) run in
        # their stored dtype, like an uncompressed checkpoint's; the rest are decoded.
        plain = {n for f in files for n in f if n in tensors and n not in formats and
                 is_float(f.dtype(n))}
        stored = LazyTensors({n: partial((raw if n in plain else tensors).__getitem__, n)
                              for n in tensors})
        dtypes = {n: f.dtype(n) for f in files for n in f if n in plain}
    else:
        tensors = transform_each(copies, _float32_tensor)
        if canonical or arch.canonical_hf_names:
            stored, dtypes = raw, {name: f.dtype(name) for f in files for name in f}
        else:
            tensors = arch.from_hf(tensors, args)
    check_tensors(tensors, args, str(folder))
    gen_path = folder / "generation_config.json"
    deployment_path = folder / DEPLOYMENT_FILE
    return Checkpoint(
        path=folder,
        format="safetensors",
        architecture=arch,
        config=config,
        tensors=tensors,
        tokenizer=Tokenizer.from_files(folder),
        generation_config=json.loads(gen_path.read_text()) if gen_path.is_file() else {},
        weight_formats=formats,
        quantized=quantized,
        deployment=json.loads(deployment_path.read_text()) if deployment_path.is_file() else {},
        stored=stored,
        stored_dtypes=dtypes,
        source_files=paths,
    )


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{folder}: shards listed in {index.name} are missing: {missing}"
            )
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    if any(p.suffix in PICKLE_SUFFIXES for p in folder.iterdir()):
        raise ValueError(pickle_refusal(folder))
    raise FileNotFoundError(f"no *.safetensors weights in {folder}")


def _float32_tensor(name: str, arr: np.ndarray) -> np.ndarray:
    return as_float32(arr)
