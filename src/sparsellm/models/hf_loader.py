"""HF model folders (config.json + *.safetensors + tokenizer files) -> Checkpoint, including
compressed-tensors folders (their stored forms decoded by compressed.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

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
from .compressed import Where, decode_compressed_tensors, is_compressed_config
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
    config_path = folder / CONFIG_FILE
    config = read_json(config_path)
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: a JSON {type(config).__name__}, not a model config "
                         "(a mapping)")
    names = config.get("architectures") or [config.get("model_type", "?")]
    try:
        arch = find_architecture(names[0])
        args = arch.args(config)
    except ValueError as e:  # what the config says: an architecture, sizes (ModelArgs' checks)
        raise type(e)(f"{config_path}: {e}") from None
    paths = _safetensors_files(folder)
    files = [SafetensorsFile(f) for f in paths]
    raw = LazyTensors({name: partial(f.__getitem__, name) for f in files for name in f})
    copies = LazyTensors({name: partial(f.read, name) for f in files for name in f})
    stored, dtypes = None, {}
    formats: dict[str, WeightFormat] = {}
    quantized: Mapping[str, QuantizedTensor] = {}
    shapes: dict[str, tuple[int, ...]] | None = {name: f.shape(name) for f in files
                                                  for name in f}
    canonical = config.get(TENSOR_NAMES_KEY) == "canonical"
    if is_compressed_config(config):  # compressed-tensors: integers, bitmasks, declared formats
        if not (canonical or arch.canonical_hf_names):
            raise ValueError(
                f"{folder}: compressed-tensors checkpoints of {names[0]} are supported as "
                "sparsellm writes them (canonical tensor names); compress the float model with "
                "`sparsellm compress` instead")
        where = Where(str(config_path), {name: str(f.path) for f in files for name in f})
        decoded = decode_compressed_tensors(transform_each(copies, _float32_tensor), config,
                                            where, shapes)
        tensors, formats, quantized = decoded.tensors, decoded.formats, decoded.quantized
        shapes, notes = decoded.shapes, decoded.notes
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
            tensors, shapes = arch.from_hf(tensors, args), None  # in memory: their own shapes
    # Errors name the file holding a tensor (a decoded weight: the file of its scales); a
    # missing one, the weights file or the folder of shards.
    file_of = {name: str(f.path) for f in files for name in f}
    file_of |= {n: file_of[n + "_scale"] for n in tensors if n + "_scale" in file_of}
    weights = str(paths[0]) if len(paths) == 1 else str(folder)
    check_tensors(tensors, args, weights, shapes, file_of)
    gen_path = folder / "generation_config.json"
    deployment_path = folder / DEPLOYMENT_FILE
    return Checkpoint(
        path=folder,
        format="safetensors",
        architecture=arch,
        config=config,
        tensors=tensors,
        tokenizer=Tokenizer.from_files(folder),
        generation_config=read_json(gen_path) if gen_path.is_file() else {},
        weight_formats=formats,
        quantized=quantized,
        deployment=read_json(deployment_path) if deployment_path.is_file() else {},
        stored=stored,
        stored_dtypes=dtypes,
        source_files=paths,
    )


def read_json(path: Path) -> Any:
    """A JSON file, or a ValueError naming it and where it stops being JSON."""
    data = path.read_bytes()
    try:
        return json.loads(data.decode())
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e.msg} (line {e.lineno}, column "
                         f"{e.colno})") from None


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(read_json(index)["weight_map"].values()))
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
