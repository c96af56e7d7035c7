"""Server settings: one strict model for the config file and the command line.

    endpoints:
      - task: text-generation
        model: ./smollm2-pruned50-quant
        route: /generate
        name: text-generation
        kwargs: {sequence_length: 256, max_generated_tokens: 32}

An endpoint's kwargs are engine settings (`EngineSettings` fields, checked by type and by the
settings' own checks into `EndpointConfig.settings`) and generation defaults (`GenerationConfig`
fields). Model paths come only from here (the command line or the config file), never from a
request.
"""

from __future__ import annotations

import functools
import re
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from ..engine import EngineSettings
from ..generation import GenerationConfig
from ..pipeline import TEXT_GENERATION_TASKS

RESERVED_ROUTES = {"/", "/health", "/metrics", "/docs", "/redoc", "/openapi.json", "/playground"}
MAX_NAME = 256
_ROUTE = re.compile(r"^/[A-Za-z0-9._~/-]*$")
NOT_KWARGS = {"model_path"}  # an endpoint's `model`, not one of its kwargs


@functools.cache
def settings_model(settings: type[EngineSettings]) -> type[BaseModel]:
    """The pydantic model of an endpoint's engine kwargs, made from the fields of `settings`
    (EngineSettings or a subclass): their types and defaults, no other key."""
    hints = typing.get_type_hints(settings)
    return create_model(
        f"{settings.__name__}Kwargs",
        __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True),
        **{f.name: (hints[f.name], ... if f.default is MISSING else f.default)
           for f in fields(settings) if f.name not in NOT_KWARGS})


def endpoint_settings(settings: type[EngineSettings], model: str,
                      kwargs: dict[str, Any]) -> EngineSettings:
    """An endpoint's engine kwargs (the entries of `kwargs` that are fields of `settings`) as
    `settings`; errors say which key and why."""
    given = {k: v for k, v in kwargs.items() if k in settings.names()}
    try:
        values = settings_model(settings).model_validate(given)
    except ValidationError as e:
        raise ValueError("; ".join(f"kwargs.{'.'.join(map(str, err['loc']))}: {err['msg']}"
                                   for err in e.errors())) from None
    try:
        return settings(model_path=model, **{k: getattr(values, k) for k in given})
    except (TypeError, ValueError) as e:
        raise ValueError(f"kwargs: {e}") from None


class EndpointConfig(BaseModel):
    """One served model. `name` is its id, what OpenAI requests put in `model`: by default the
    `model` string as given (vLLM's convention)."""

    model_config = ConfigDict(extra="forbid")

    task: str = "text-generation"
    model: str
    route: str | None = None
    name: str | None = None
    # engine settings (EngineSettings fields but model_path) and generation defaults
    # (GenerationConfig fields)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    _engine_settings: EngineSettings | None = PrivateAttr(default=None)

    @field_validator("task")
    @classmethod
    def _task(cls, v: str) -> str:
        if v.lower() not in TEXT_GENERATION_TASKS:
            raise ValueError(f"unknown task {v!r}; supported: {', '.join(TEXT_GENERATION_TASKS)}")
        return v

    @field_validator("route")
    @classmethod
    def _route(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v if v.startswith("/") else "/" + v
        if not _ROUTE.match(v) or v.startswith("/v1/") or v in RESERVED_ROUTES:
            raise ValueError(f"invalid route {v!r}: a path like /generate, not a built-in route")
        return v.rstrip("/") or v

    @field_validator("kwargs")
    @classmethod
    def _kwargs(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        settings = _settings_type(info)
        accepted = (set(settings.names()) - NOT_KWARGS) | GenerationConfig.names()
        unknown = set(v) - accepted
        if unknown:
            raise ValueError(f"unknown kwargs {sorted(unknown)}; accepted: {sorted(accepted)}")
        generation = {k: x for k, x in v.items() if k in GenerationConfig.names()}
        GenerationConfig.from_kwargs(**generation)  # fail at startup, not on the first request
        return v

    @model_validator(mode="after")
    def _settings(self, info: ValidationInfo) -> EndpointConfig:
        self._engine_settings = endpoint_settings(_settings_type(info), self.model, self.kwargs)
        return self

    @property
    def settings(self) -> EngineSettings:
        """The engine settings of this endpoint: its model and its kwargs' engine settings."""
        if self._engine_settings is None:  # built without validation (model_construct)
            self._engine_settings = endpoint_settings(EngineSettings, self.model, self.kwargs)
        return self._engine_settings

    @property
    def generation_kwargs(self) -> dict[str, Any]:
        """The kwargs that are generation defaults (GenerationConfig fields)."""
        return {k: v for k, v in self.kwargs.items() if k in GenerationConfig.names()}

    @model_validator(mode="after")
    def _name(self) -> EndpointConfig:
        if self.name is None:
            self.name = self.model
        if not 0 < len(self.name) <= MAX_NAME or not self.name.isprintable() \
                or self.name.strip() != self.name:
            raise ValueError(f"invalid endpoint name {self.name!r}: 1 to {MAX_NAME} printable "
                             "characters, without leading or trailing spaces")
        return self


class ServerConfig(BaseModel):
    """Everything `sparsellm serve` needs; the config file has the same keys."""

    model_config = ConfigDict(extra="forbid")

    endpoints: list[EndpointConfig] = Field(min_length=1)
    host: str = "127.0.0.1"
    port: int = Field(5543, ge=0, le=65535)
    integration: Literal["local", "openai"] | None = None  # None: both route sets
    api_key: str | None = None
    max_concurrent_requests: int = Field(4, ge=1, le=256)  # engine batch slots per model
    max_queue: int = Field(64, ge=0, le=100_000)  # requests waiting for a slot, per model
    num_cores: int | None = Field(None, ge=1)
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"
    max_request_bytes: int = Field(1 << 20, ge=1024)
    drain_timeout: float = Field(30.0, ge=0)  # seconds SIGTERM waits for in-flight requests
    max_n: int = Field(8, ge=1, le=128)  # cap on OpenAI `n`

    @model_validator(mode="after")
    def _unique(self) -> ServerConfig:
        names = [e.name for e in self.endpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"endpoint names must be unique, got {names}")
        routes = [r for i in range(len(self.endpoints)) for r in endpoint_routes(self, i)]
        if len(set(routes)) != len(routes):
            raise ValueError(f"endpoint routes must be unique, got {routes}; set `route` "
                             "on the endpoints")
        return self

    @property
    def openai_routes(self) -> bool:
        return self.integration in (None, "openai")

    @property
    def local_routes(self) -> bool:
        return self.integration in (None, "local")

    @classmethod
    def load(cls, path: str | Path | None = None,
             settings: type[EngineSettings] = EngineSettings, **overrides: Any) -> ServerConfig:
        """Read a YAML config file (if any) and apply command-line `overrides` (None = unset);
        endpoints' engine kwargs are validated as `settings` (EngineSettings or a subclass)."""
        data: dict[str, Any] = {}
        if path is not None:
            text = Path(path).read_text()
            data = yaml.safe_load(text) or {}
            if not isinstance(data, dict):
                raise ValueError(f"{path}: expected a mapping with an `endpoints` list")
        data.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(data, context={"settings": settings})
        except ValidationError as e:
            where = f"{path}: " if path else ""
            lines = [f"{'.'.join(map(str, err['loc'])) or 'config'}: "
                     f"{err['msg'].removeprefix('Value error, ')}" for err in e.errors()]
            raise ValueError(where + "invalid server config: " + "; ".join(lines)) from None


def _settings_type(info: ValidationInfo) -> type[EngineSettings]:
    return (info.context or {}).get("settings", EngineSettings)


def route_name(name: str) -> str:
    """A served id as one path segment: `./models/pruned50` -> `models-pruned50`,
    `hf:org/model` -> `hf-org-model`."""
    return re.sub(r"[^A-Za-z0-9._~-]+", "-", name).strip("-.") or "model"


def endpoint_routes(config: ServerConfig, index: int) -> list[str]:
    """/predict serves the first endpoint; every endpoint also serves its own `route` (by
    default, after the first, /<its id as one path segment>/predict)."""
    e = config.endpoints[index]
    routes = ["/predict"] if index == 0 else []
    if e.route and e.route not in routes:
        routes.append(e.route)
    if not routes:
        routes.append(f"/{route_name(e.name or e.model)}/predict")
    return routes
