"""Write a compressed model as an HF folder following the compressed-tensors conventions
(see sparsellm.models.compressed for the stored forms), atomically: everything is written into a
hidden temporary folder next to `output_dir` and renamed into place (`sparsellm.atomic`), so an
interrupted run never leaves a half-written folder."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_folder, write_json_atomic
from ..models.checkpoint import TENSOR_NAMES_KEY, Checkpoint
from ..models.compressed import bitmask_compress, pack_int32
from ..models.ct_args import activation_args, weight_args
from ..models.decoder import EMBEDDING
from ..models.formats import QuantizedTensor, Sparsity, WeightFormat
from ..models.safetensors_io import write_safetensors
from ..weight_format import CT_BITMASK, CT_DENSE, CT_SPARSITY_FORMATS

VERSION = "sparsellm-0.1.0"
# How sparse weights are laid out in the file (compressed-tensors' sparsity formats):
# "dense": the zeros are stored in place (int8 `weight`, or the float weight), which every
# current reader (compressed-tensors >= 0.13, transformers, vLLM) loads; the sparsity is
# described in `sparsity_config` and measured again when sparsellm loads the file.
# "sparse-bitmask": kept values + a bitmask per row (about 40% smaller at 50% sparsity), read by
# sparsellm and compressed-tensors <= 0.12 only (later releases dropped the layout).
SPARSITY_FORMATS = CT_SPARSITY_FORMATS


def check_sparsity_format(name: str) -> None:
    if name not in SPARSITY_FORMATS:
        raise ValueError(f"sparsity_format {name!r} is not one of {', '.join(SPARSITY_FORMATS)}")


@dataclass
class CompressedModel:
    """What the writer needs: the source checkpoint (config, tokenizer), the final fp32 tensors
    and, for the compressed weights, their declared formats, exact integers and keep masks, or
    (once a layer is done during compression) their stored arrays already encoded."""

    source: Checkpoint
    tensors: Mapping[str, np.ndarray]  # every tensor, fp32 (dequantized where quantized)
    formats: dict[str, WeightFormat] = field(default_factory=dict)
    quantized: dict[str, QuantizedTensor] = field(default_factory=dict)
    masks: dict[str, np.ndarray] = field(default_factory=dict)  # float sparse weights: keep mask
    encoded: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # encode_tensor's
    zeros: dict[str, int] = field(default_factory=dict)  # exact zeros of a compressed weight
    sparsity_format: str = CT_DENSE  # one of SPARSITY_FORMATS

    def __post_init__(self) -> None:
        check_sparsity_format(self.sparsity_format)

    @property
    def bitmasked(self) -> bool:
        return self.sparsity_format == CT_BITMASK


def _module(name: str) -> str:
    return name[: -len(".weight")]


def scheme(fmt: WeightFormat) -> dict[str, Any]:
    """A config group's `weights` and `input_activations` (models/ct_args.py's, with the keys
    compressed-tensors writes beside them)."""
    acts = activation_args(fmt)
    return {"weights": {**weight_args(fmt), "actorder": None, "observer": "minmax",
                        "observer_kwargs": {}, "block_structure": None},
            "input_activations": acts and {**acts, "actorder": None, "observer": None,
                                           "observer_kwargs": {}, "block_structure": None}}


def encode_tensor(model: CompressedModel, name: str) -> dict[str, np.ndarray]:
    """The stored arrays of one canonical tensor (int8 `weight`, `weight_packed`, sparse-bitmask
    parts, scales, or the fp32 tensor itself)."""
    w = model.tensors[name]
    m = _module(name) if name.endswith(".weight") else name
    qt = model.quantized.get(name)
    if qt is not None:
        rows, cols = qt.q.shape
        parts = {f"{m}.weight_scale": qt.scale.astype(np.float32)}
        if qt.format.bits == 8:
            if qt.mask is not None and model.bitmasked:
                zp_full = 0 if qt.zero_point is None else np.repeat(
                    qt.zero_point, cols // qt.scale.shape[1], axis=1)
                keep = qt.mask & (qt.q != zp_full)
                parts.update({f"{m}.{k}": v for k, v in bitmask_compress(qt.q, keep).items()})
            else:
                parts[f"{m}.weight"] = qt.q.astype(np.int8)
            if qt.zero_point is not None:
                parts[f"{m}.weight_zero_point"] = qt.zero_point.astype(np.int8)
        else:
            parts[f"{m}.weight_packed"] = pack_int32(qt.q, qt.format.bits)
            parts[f"{m}.weight_shape"] = np.asarray([rows, cols], dtype=np.int64)
            if qt.zero_point is not None:
                parts[f"{m}.weight_zero_point"] = pack_int32(qt.zero_point, qt.format.bits,
                                                             axis=0)
        return parts
    if name in model.masks and model.bitmasked:
        keep = model.masks[name] & (w != 0)
        return {f"{m}.{k}": v for k, v in bitmask_compress(
            np.asarray(w, dtype=np.float32), keep).items()}
    if name not in model.formats and name in model.source.stored:
        return {name: model.source.stored[name]}  # untouched: as the source stores it (bf16)
    return {name: np.asarray(w, dtype=np.float32)}


def unties_lm_head(model: CompressedModel) -> bool:
    """A tied model whose embedding is quantized is written untied, with the lm_head stored as
    a copy of the embedding's integers and scales (as llm-compressor does): transformers ties
    the lm_head to the embedding's *compressed* parameter otherwise, and fails on it."""
    fmt = model.formats.get(EMBEDDING)
    return "lm_head.weight" not in model.tensors and fmt is not None and fmt.bits < 32


def encode_tensors(model: CompressedModel) -> dict[str, dict[str, np.ndarray]]:
    """{canonical tensor name: its stored arrays}, for every tensor of the model."""
    out = {name: model.encoded[name] if name in model.encoded else encode_tensor(model, name)
           for name in model.tensors}
    if unties_lm_head(model):
        embed = _module(EMBEDDING)
        out["lm_head.weight"] = {"lm_head" + k[len(embed):]: v
                                 for k, v in out[EMBEDDING].items()}
    return out


def quantization_config(model: CompressedModel) -> dict[str, Any] | None:
    """config.json `quantization_config` (with `sparsity_config` nested, as compressed-tensors
    writes it), or None for an uncompressed model."""
    groups: dict[tuple, list[str]] = {}
    quantized = {n: f for n, f in model.formats.items() if f.bits < 32}
    if unties_lm_head(model):
        quantized["lm_head.weight"] = quantized[EMBEDDING]
    for name, f in quantized.items():
        groups.setdefault((f.bits, f.group_size, f.symmetric, f.activation_bits), []).append(
            _module(name))
    config_groups = {}
    formats = set()
    for i, ((bits, gs, sym, act), names) in enumerate(groups.items()):
        fmt_name = "int-quantized" if bits == 8 else "pack-quantized"
        formats.add(fmt_name)
        config_groups[f"group_{i}"] = {
            "targets": sorted(names),
            **scheme(WeightFormat(bits=bits, group_size=gs, symmetric=sym,
                                  activation_bits=act)),
            "output_activations": None,
            "format": fmt_name,
        }
    sparse = {n: f for n, f in model.formats.items() if f.sparsity}
    if not config_groups and not sparse:
        return None
    out: dict[str, Any] = {"quant_method": "compressed-tensors", "version": VERSION}
    if config_groups:
        quantized_modules = {_module(n) for n in quantized}
        all_linear = {_module(n) for n in _matrices(model) if n.endswith(".weight")}
        out.update({
            "format": formats.pop() if len(formats) == 1 else "mixed-precision",
            "config_groups": config_groups,
            "ignore": sorted(all_linear - quantized_modules),
            "kv_cache_scheme": None,
            "quantization_status": "compressed",
        })
    if sparse:
        bitmasked = model.bitmasked and any(f.bits in (8, 32) for f in sparse.values())
        structures = {f.sparsity for f in sparse.values()}
        total = sum(_matrices(model).values())
        zeros = sum(model.zeros[n] if n in model.zeros else int((model.tensors[n] == 0).sum())
                    for n in sparse)
        out["sparsity_config"] = {
            "format": CT_BITMASK if bitmasked else CT_DENSE,
            "global_sparsity": zeros / max(total, 1),
            "sparsity_structure": str(structures.pop() if len(structures) == 1
                                      else Sparsity.BITMASK),
            "targets": sorted(_module(n) for n in sparse),
            "ignore": [],
            "registry_requires_subclass": False,
        }
    return out


def _matrices(model: CompressedModel) -> dict[str, int]:
    """{name: size} of the 2-D tensors, from the source's stored tensors (views of its files:
    nothing is read or widened for a shape)."""
    stored = model.source.stored
    return {n: stored[n].size for n in model.tensors if n in stored and stored[n].ndim == 2}


def hf_config(source: Checkpoint) -> dict[str, Any]:
    """The source's config as an HF config.json (for a GGUF, the config its metadata maps to).

    Tensors are always written under their canonical (Llama-style) names. For the families
    whose HF names they are (`Architecture.canonical_hf_names`: Llama, Qwen3) the folder is a
    regular compressed-tensors checkpoint.
    Other architectures get an explicit marker (TENSOR_NAMES_KEY) instead of their own names:
    compression formats are declared per canonical linear (q/k/v and gate/up are compressed and
    quantized separately, with their own scales and bitmasks), and writing the architecture's
    fused / transposed / permuted tensors back (GPT-2 Conv1D, CodeGen and NeoX fused qkv, GPT-J
    RoPE row order, OPT's position offset) would mean re-fusing integers, scales and masks for
    no benefit to sparsellm; the loader skips the name map when it sees the marker."""
    config = {k: v for k, v in source.config.items()
              if k not in ("quantization_config", "compression_config", "sparsity_config")}
    if source.architecture.canonical_hf_names:
        config.setdefault("hidden_act", "silu")
    else:
        config[TENSOR_NAMES_KEY] = "canonical"
    config["torch_dtype"] = {"bfloat16": "bfloat16", "float16": "float16"}.get(
        source.stored_dtype("model.embed_tokens.weight").name, "float32")
    return config


def write_tokenizer(source: Checkpoint, folder: Path) -> None:
    tok = source.tokenizer
    tok._tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok.bos_token, "eos_token": tok.eos_token,
        "pad_token": tok.pad_token, "unk_token": tok.unk_token,
        "model_max_length": source.args.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
    }
    if tok.chat_template:
        config["chat_template"] = tok.chat_template
    write_json_atomic(folder / "tokenizer_config.json", {k: v for k, v in config.items()
                                                   if v is not None})


def write_model_files(
    model: CompressedModel,
    folder: Path,
    recipe_yaml: str | None = None,
    report: dict[str, Any] | None = None,
    encoded: dict[str, dict[str, np.ndarray]] | None = None,
) -> None:
    """Write the model's files into an (empty, temporary) folder; config.json last."""
    encoded = encoded if encoded is not None else encode_tensors(model)
    stored = {k: v for parts in encoded.values() for k, v in parts.items()}
    write_safetensors(folder / "model.safetensors", stored, metadata={"format": "pt"})
    del stored
    write_tokenizer(model.source, folder)
    gen = dict(model.source.generation_config)
    gen.setdefault("bos_token_id", model.source.config.get("bos_token_id"))
    eos = model.source.eos_token_ids
    if eos:
        gen["eos_token_id"] = eos if len(eos) > 1 else eos[0]
    write_json_atomic(folder / "generation_config.json", {k: v for k, v in gen.items()
                                                        if v is not None})
    if recipe_yaml is not None:
        (folder / "recipe.yaml").write_text(recipe_yaml)
    if report is not None:
        write_json_atomic(folder / "compression_report.json", report)
    config = hf_config(model.source)
    if unties_lm_head(model):
        config["tie_word_embeddings"] = False
    qconfig = quantization_config(model)
    if qconfig is not None:
        config["quantization_config"] = qconfig
    write_json_atomic(folder / "config.json", config)


def save_compressed(
    model: CompressedModel,
    output_dir: str | Path,
    recipe_yaml: str | None = None,
    report: dict[str, Any] | None = None,
    overwrite: bool = False,
    encoded: dict[str, dict[str, np.ndarray]] | None = None,
) -> Path:
    """Write the folder atomically (see `atomic_folder`) -> its path. `encoded`:
    `encode_tensors(model)` if the caller already has it."""
    with atomic_folder(output_dir, overwrite) as tmp:
        write_model_files(model, tmp, recipe_yaml, report, encoded)
    return Path(output_dir).expanduser().absolute()
