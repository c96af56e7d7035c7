"""Architectures (math), loaders (I/O) and the registry of model names."""

from .architectures import ARCHITECTURES, find_architecture, supported_names
from .checkpoint import Checkpoint
from .load import load_checkpoint, resolve_model_path
from .registry import DEFAULT_MODEL, MODELS

__all__ = [
    "ARCHITECTURES", "Checkpoint", "DEFAULT_MODEL", "MODELS", "find_architecture",
    "load_checkpoint", "resolve_model_path", "supported_names",
]
