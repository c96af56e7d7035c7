"""sparsellm: fast LLM text generation on CPUs through sparsity and quantization."""

from .compression import compress
from .engine import ContextLengthError, Engine
from .evaluation import evaluate
from .export import export
from .generation import GenerationConfig
from .models import DEFAULT_MODEL, load_checkpoint
from .pipeline import GeneratedText, Pipeline, TextGeneration, TextGenerationOutput

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL", "ContextLengthError", "Engine", "GeneratedText", "GenerationConfig",
    "Pipeline", "TextGeneration", "TextGenerationOutput", "compress", "evaluate", "export",
    "load_checkpoint",
]
