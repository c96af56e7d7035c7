"""The loaded-model type every loader returns (`Checkpoint`), and what the loaders share: the
tensors check, the file conventions (pickle refused, an exported folder's settings, the marker for
canonical tensor names). The loaders: hf_loader.py (HF safetensors folders, compressed-tensors
ones included), gguf_loader.py; load.py picks one for a path."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..tokenizer import Tokenizer
from .architectures import Architecture
from .decoder import (
    DecoderModel,
    ModelArgs,
    layer_weight_names,
    linear_weight_names,
    tensor_shape,
)
from .formats import QuantizedTensor, WeightFormat

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


def pickle_refusal(path: Path) -> str:
    """Why a pickle file (or a folder of them) is not loaded, and how to convert it."""
    return (
        f"{path}: refusing pickle weights (they can run arbitrary code on load); sparsellm loads "
        "safetensors and GGUF only. Convert with transformers: "
        "`AutoModelForCausalLM.from_pretrained(src).save_pretrained(dst, safe_serialization=True)`"
    )


def check_layers(args: ModelArgs, tensor_count: int, where: str) -> None:
    """A config with more layers than the file has tensors is refused before anything is
    done per layer (a damaged layer count can be billions)."""
    if args.num_hidden_layers > tensor_count:
        raise ValueError(f"{where}: the config has {args.num_hidden_layers} layers, but the "
                         f"file holds {tensor_count} tensors in all")


def check_tensors(tensors: Mapping[str, np.ndarray], args: ModelArgs, where: str,
                  shapes: Mapping[str, tuple[int, ...]] | None = None,
                  files: Mapping[str, str] | None = None) -> None:
    """Every tensor the decoder spec needs is there (a clear error instead of a KeyError), and
    has the shape the spec gives it (`shapes`: the file's own, read from its header without
    reading the tensors; default: the arrays' shapes, for tensors held in memory): a file that
    disagrees with its config is refused here by name (`files`: the file holding each tensor,
    else `where`), never met later as a NumPy error or an out-of-bounds read of the native
    kernels."""
    check_layers(args, len(tensors), where)
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
    if shapes is None:
        shapes = {n: t.shape for n, t in tensors.items()} if isinstance(tensors, dict) else {}
    for name, shape in shapes.items():
        want = tensor_shape(args, name)
        if want is not None and tuple(shape) != want:
            raise ValueError(f"{(files or {}).get(name, where)}: tensor {name} has shape "
                             f"{tuple(shape)}, but the model's config makes it {want}")
