"""The one generation core: sampling, stopping, streaming text, batching."""

from .config import GenerationConfig
from .generator import BatchGenerator, GenerationRequest, TokenEvent
from .sampling import Sampler, make_distribution, make_logits_processors
from .stack import Stack, build_stack
from .text import IncrementalDetokenizer, StopStrings

__all__ = [
    "BatchGenerator", "GenerationConfig", "GenerationRequest", "IncrementalDetokenizer",
    "Sampler", "Stack", "StopStrings", "TokenEvent", "build_stack", "make_distribution",
    "make_logits_processors",
]
