"""HTTP serving: DeepSparse-style /predict, an OpenAI-compatible /v1 API with streaming and
continuous batching, and a browser playground. `sparsellm serve` runs it."""

from __future__ import annotations

from typing import Any

__all__ = ["EndpointConfig", "ModelProvider", "ServerConfig", "create_app", "serve"]


def __getattr__(name: str) -> Any:
    """The exports, imported on first use: every `sparsellm` command reads the serve options
    (`server/options.py`) at start, and those must not cost an import of FastAPI."""
    if name in ("create_app", "serve"):
        from . import app
        return getattr(app, name)
    if name in ("EndpointConfig", "ServerConfig"):
        from . import config
        return getattr(config, name)
    if name == "ModelProvider":
        from . import provider
        return provider.ModelProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
