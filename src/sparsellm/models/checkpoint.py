"""Load a model from any source (GGUF file, HF folder, registry name, hf:org/name) into canonical
tensors + config + tokenizer. I/O lives here; architectures hold only math."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..dtypes import as_float32, is_float
from ..tokenizer import Tokenizer
from .architectures import Architecture, find_architecture
from .compressed import decode_compressed_tensors, is_compressed_config
from .decoder import DecoderModel, ModelArgs, layer_weight_names, linear_weight_names
from .formats import QuantizedTensor, WeightFormat
from .lazy import LazyTensors, transform_each
from .registry import MODELS, resolve_hf_cache, resolve_registered
from .safetensors_io import SafetensorsFile

logger = logging.getLogger(__name__)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
DEPLOYMENT_FILE = "deployment.json"  # written by sparsellm.export: task, sequence_length
# config.json key sparsellm writes when the safetensors hold canonical (decoder.py) tensor names
# instead of the architecture's own HF names (see compression/save.py for why).
TENSOR_NAMES_KEY = "sparsellm_tensor_names"


@dataclass
class Checkpoint:
    """A loaded model: canonical (HF-named) tensors, config and tokenizer.

    `tensors` always gives fp32 values (dequantized where the checkpoint stores integers), which
    the NumPy reference path and calibration use; `stored` gives the same tensors in the float
    dtype the file holds them in (bfloat16, float16 or float32; memory-mapped views where the
    file's layout allows), which the native runtime packs from without widening the model to
    fp32; `weight_formats` says how a tensor is stored and should run natively, and `quantized`
    gives the exact integers for those that are. From safetensors all are LazyTensors: read from
    the files at each access, never kept.
    """

    path: Path
    format: str  # "gguf" | "safetensors"
    architecture: Architecture
    config: dict[str, Any]
    tensors: Mapping[str, np.ndarray]
    tokenizer: Tokenizer
    generation_config: dict[str, Any] = field(default_factory=dict)
    # Declared formats of the tensors that are not dense fp32, and their exact stored values.
    weight_formats: dict[str, WeightFormat] = field(default_factory=dict)
    quantized: Mapping[str, QuantizedTensor] = field(default_factory=dict)
    deployment: dict[str, Any] = field(default_factory=dict)  # an exported folder's settings
    stored: Mapping[str, np.ndarray] | None = None  # None: the same as `tensors` (fp32)
    stored_dtypes: dict[str, np.dtype] = field(default_factory=dict)  # absent: float32
    source_files: list[Path] = field(default_factory=list)  # the weight files read

    def __post_init__(self) -> None:
        if self.stored is None:
            self.stored = self.tensors

    def with_tensors(self, tensors: Mapping[str, np.ndarray]) -> Checkpoint:
        """A copy over other fp32 tensors (e.g. pruned or perturbed in memory), which are then
        also what the native runtime packs from (and no longer the files')."""
        return dataclasses.replace(self, tensors=tensors, stored=None, stored_dtypes={},
                                   source_files=[])

    def stored_dtype(self, name: str) -> np.dtype:
        """The dtype `stored[name]` has, known without reading it."""
        return self.stored_dtypes.get(name, np.dtype(np.float32))

    @property
    def args(self) -> ModelArgs:
        return self.architecture.args(self.config)

    @property
    def linear_weight_names(self) -> list[str]:
        """The 2-D weights formats and compression apply to (lm_head included)."""
        return linear_weight_names(self.args)

    def build_model(self, tensors: Mapping[str, np.ndarray] | None = None) -> DecoderModel:
        """The NumPy reference model over `tensors` (default: the checkpoint's own, read into
        memory once in fp32: the reference forward is for small models and checks)."""
        return DecoderModel(self.args, tensors if tensors is not None else dict(self.tensors))

    @property
    def eos_token_ids(self) -> list[int]:
        """EOS ids from generation_config.json, config.json and the tokenizer, deduplicated."""
        ids: list[int] = []
        for source in (self.generation_config.get("eos_token_id"), self.config.get("eos_token_id")):
            ids += source if isinstance(source, list) else [source] if source is not None else []
        ids += self.tokenizer.eos_token_ids
        return list(dict.fromkeys(int(i) for i in ids))


def resolve_model_path(model_path: str | Path) -> Path:
    """Registry name, `hf:org/name`, or a path -> an existing local path, or a clear error."""
    text = str(model_path)
    if text in MODELS:
        return resolve_registered(text)
    if text.startswith("hf:"):
        return resolve_hf_cache(text[3:])
    path = Path(text).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model path {text!r} does not exist; pass a GGUF file, a Hugging Face model folder "
            f"(config.json + *.safetensors), `hf:org/name` from the local cache, or a registry "
            f"name ({', '.join(MODELS)}; see `sparsellm models`)"
        )
    return path


def load_checkpoint(model_path: str | Path) -> Checkpoint:
    path = resolve_model_path(model_path)
    if path.is_file():
        if path.suffix.lower() in PICKLE_SUFFIXES:
            raise ValueError(_pickle_refusal(path))
        if path.suffix.lower() != ".gguf" and not _is_gguf(path):
            raise ValueError(f"{path} is not a GGUF file; pass a .gguf file or a model folder")
        from .gguf_loader import load_gguf

        return load_gguf(path)
    return _load_hf_folder(path)


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _pickle_refusal(path: Path) -> str:
    return (
        f"{path}: refusing pickle weights (they can run arbitrary code on load); sparsellm loads "
        "safetensors and GGUF only. Convert with transformers: "
        "`AutoModelForCausalLM.from_pretrained(src).save_pretrained(dst, safe_serialization=True)`"
    )


def _load_hf_folder(folder: Path) -> Checkpoint:
    config_path = folder / "config.json"
    if not config_path.is_file():
        ggufs = sorted(folder.glob("*.gguf"))
        if len(ggufs) == 1:
            from .gguf_loader import load_gguf

            return load_gguf(ggufs[0])
        raise FileNotFoundError(f"{config_path} not found; {folder} is not a model folder")
    config = json.loads(config_path.read_text())
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


def check_tensors(tensors: dict[str, np.ndarray], args: ModelArgs, where: str) -> None:
    """Every tensor the decoder spec needs is there (a clear error instead of a KeyError)."""
    need = ["model.embed_tokens.weight", "model.norm.weight"]
    need += [n for i in range(args.num_hidden_layers) for n in layer_weight_names(args, i)]
    need += ["model.embed_positions.weight"] if args.learned_positions else []
    need += ["model.norm.bias"] if args.norm == "layer" else []
    need += ["lm_head.bias"] if args.lm_head_bias else []
    need += [] if args.tie_word_embeddings else ["lm_head.weight"]
    missing = [n for n in need if n not in tensors]
    if missing:
        raise ValueError(f"{where}: missing tensors {missing[:5]} ({len(missing)} in all) for "
                         "this architecture's config")


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
        raise ValueError(_pickle_refusal(folder))
    raise FileNotFoundError(f"no *.safetensors weights in {folder}")


def _float32_tensor(name: str, arr: np.ndarray) -> np.ndarray:
    return as_float32(arr)
