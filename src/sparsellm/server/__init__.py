"""HTTP serving: DeepSparse-style /predict, an OpenAI-compatible /v1 API with streaming and
continuous batching, and a browser playground. `sparsellm serve` runs it."""

from .app import create_app, serve
from .config import EndpointConfig, ServerConfig
from .provider import ModelProvider

__all__ = ["EndpointConfig", "ModelProvider", "ServerConfig", "create_app", "serve"]
