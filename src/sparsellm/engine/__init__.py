"""The engine boundary: tokens in, NumPy logits out."""

from .engine import ContextLengthError, Engine
from .kv_cache import KVCache
from .memory_check import ModelTooLargeError
from .settings import EngineSettings

__all__ = ["ContextLengthError", "Engine", "EngineSettings", "KVCache", "ModelTooLargeError"]
