"""Load a model from any source (registry name, hf:org/name, GGUF file, HF folder) into a
Checkpoint: canonical tensors + config + tokenizer. This module only picks the loader; each source
has its own (hf_loader.py, gguf_loader.py), and architectures hold only math."""

from __future__ import annotations

from pathlib import Path

from .checkpoint import PICKLE_SUFFIXES, Checkpoint, pickle_refusal
from .gguf_loader import load_gguf
from .hf_loader import CONFIG_FILE, load_hf_folder
from .registry import MODELS, resolve_hf_cache, resolve_registered


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
    """Load a model from a registry name, `hf:org/name`, a GGUF file or a model folder (HF
    safetensors, compressed-tensors, or a folder holding one GGUF and no config.json)."""
    path = resolve_model_path(model_path)
    if path.is_file():
        if path.suffix.lower() in PICKLE_SUFFIXES:
            raise ValueError(pickle_refusal(path))
        if path.suffix.lower() != ".gguf" and not _is_gguf(path):
            raise ValueError(f"{path} is not a GGUF file; pass a .gguf file or a model folder")
        return load_gguf(path)
    if (path / CONFIG_FILE).is_file():
        return load_hf_folder(path)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return load_gguf(ggufs[0])
    raise FileNotFoundError(f"{path / CONFIG_FILE} not found; {path} is not a model folder")


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"
