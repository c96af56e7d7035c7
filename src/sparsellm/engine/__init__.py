"""The engine boundary: tokens in, NumPy logits out."""

from .engine import ContextLengthError, Engine
from .kv_cache import KVCache

__all__ = ["ContextLengthError", "Engine", "KVCache"]
