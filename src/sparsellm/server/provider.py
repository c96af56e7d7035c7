"""The model provider: what the app serves. Injected into `create_app` so tests pick the model.

`ModelProvider.endpoints` is known at once (routes are registered from it); `load()` builds the
pipelines and their schedulers and runs in a background thread after startup.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..generation import GenerationConfig
from ..pipeline import TextGeneration
from .config import ServerConfig, endpoint_routes
from .metrics import Metrics
from .scheduler import Scheduler

log = logging.getLogger("sparsellm.server")


@dataclass
class Endpoint:
    """A served model as the routes know it before it is loaded."""

    name: str
    routes: list[str]


@dataclass
class ServedModel:
    name: str
    pipeline: TextGeneration
    scheduler: Scheduler
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def sequence_length(self) -> int:
        return self.pipeline.sequence_length

    @property
    def defaults(self) -> GenerationConfig:
        return self.pipeline.generation_config


class ModelProvider:
    """Loads every endpoint of a `ServerConfig` as a `TextGeneration` + `Scheduler`.

    `factory(model_path, settings=EngineSettings, **generation_defaults)` builds a pipeline
    (TextGeneration by default) from the endpoint's settings (`EndpointConfig.settings`); the
    engine's batch slots are `max_concurrent_requests` and its threads the server's `num_cores`
    unless an endpoint's kwargs set `batch_size` / `num_cores`.
    """

    def __init__(self, config: ServerConfig,
                 factory: Callable[..., TextGeneration] = TextGeneration):
        self.config = config
        self.factory = factory
        self.endpoints = [Endpoint(e.name or "", endpoint_routes(config, i))
                          for i, e in enumerate(config.endpoints)]

    def load(self, metrics: Metrics) -> list[ServedModel]:
        served = []
        for e in self.config.endpoints:
            defaults = dict(batch_size=self.config.max_concurrent_requests,
                            num_cores=self.config.num_cores)
            settings = e.settings.replace(**{k: v for k, v in defaults.items()
                                             if k not in e.kwargs})
            start = time.perf_counter()
            pipeline = self.factory(e.model, settings=settings, **e.generation_kwargs)
            log.info("loaded %s (%s) in %.1f s: %d batch slots, sequence_length %d", e.name,
                     e.model, time.perf_counter() - start, pipeline.engine.max_sequences,
                     pipeline.sequence_length)
            scheduler = Scheduler(pipeline.generator, e.name or "", self.config.max_queue,
                                  metrics)
            served.append(ServedModel(e.name or "", pipeline, scheduler))
        return served
