"""sparsellm: fast LLM text generation on CPUs through sparsity and quantization."""

from .engine import ContextLengthError, Engine
from .generation import GenerationConfig
from .models import DEFAULT_MODEL, load_checkpoint
from .pipeline import GeneratedText, Pipeline, TextGeneration, TextGenerationOutput

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL", "ContextLengthError", "Engine", "GeneratedText", "GenerationConfig",
    "Pipeline", "TextGeneration", "TextGenerationOutput", "load_checkpoint",
]
