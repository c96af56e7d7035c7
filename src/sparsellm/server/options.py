"""`sparsellm serve`'s options, and the `ServerConfig` they make: what the command
(`commands/serve.py`) and the Ray app (`cluster/serve.py`, which checks its arguments with the
same parser) share.

    sparsellm serve --task text-generation --model_path smollm2-135m-instruct   # 127.0.0.1:5543
    sparsellm serve ./pruned50-quant --served-model-name pruned --kv-cache-dtype int8
    sparsellm serve --config-file config.yaml
"""

from __future__ import annotations

import argparse
import os

from ..engine import EngineSettings
from ..models import DEFAULT_MODEL
from .config import ServerConfig


def add_arguments(p: argparse.ArgumentParser,
                  settings: type[EngineSettings] = EngineSettings) -> None:
    """The server's flags, then the engine settings' (`settings`: EngineSettings or a
    subclass)."""
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help=f"model to serve (path, GGUF, registry name, hf:org/name; default "
                        f"{DEFAULT_MODEL}); the same as --model_path")
    p.add_argument("--task", default=None, help="text-generation (the default)")
    p.add_argument("--model_path", "--model-path", dest="model_path", default=None,
                   help="model to serve, as MODEL")
    p.add_argument("--served-model-name", "--served_model_name", dest="served_model_name",
                   default=None, help="the model's id in /v1/models and in requests' `model` "
                                      "(default: MODEL as given)")
    p.add_argument("--config-file", "--config_file", dest="config_file", default=None,
                   help="YAML file with `endpoints` (task, model, route, name, kwargs) and "
                        "any of the settings below")
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 5543)")
    p.add_argument("--integration", choices=["local", "openai"], default=None,
                   help="only /predict (local) or only /v1 (openai); default both")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (default: $SPARSELLM_API_KEY)")
    p.add_argument("--max-concurrent-requests", type=int, default=None,
                   help="sequences generated together per model = engine batch slots (default 4)")
    p.add_argument("--max-queue", type=int, default=None,
                   help="requests waiting for a slot per model before 429s (default 64)")
    p.add_argument("--max-request-bytes", type=int, default=None,
                   help="largest request body accepted (default 1 MiB)")
    p.add_argument("--drain-timeout", type=float, default=None,
                   help="seconds SIGTERM waits for in-flight requests (default 30)")
    p.add_argument("--log-level", default=None,
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    settings.add_arguments(p)


def server_config(args: argparse.Namespace,
                  settings: type[EngineSettings] = EngineSettings) -> ServerConfig:
    """The command line (and its --config-file) as one validated ServerConfig; the engine
    flags become the endpoint's kwargs, validated as `settings`."""
    overrides = dict(
        host=args.host, port=args.port, integration=args.integration,
        api_key=args.api_key or os.environ.get("SPARSELLM_API_KEY") or None,
        max_concurrent_requests=args.max_concurrent_requests, max_queue=args.max_queue,
        num_cores=args.num_cores, log_level=args.log_level,
        max_request_bytes=args.max_request_bytes, drain_timeout=args.drain_timeout,
    )
    engine = settings.given(args)
    engine.pop("num_cores", None)  # a server setting (overrides above), for every endpoint
    if args.model is not None and args.model_path is not None:
        raise ValueError(f"two models given: {args.model!r} and --model_path "
                         f"{args.model_path!r}; give one (serve several with --config-file)")
    model = args.model or args.model_path
    if args.config_file is None or model is not None:
        model = model or DEFAULT_MODEL
        overrides["endpoints"] = [{"task": args.task or "text-generation", "model": model,
                                   "name": args.served_model_name or model, "kwargs": engine}]
    elif args.task is not None or engine or args.served_model_name is not None:
        given = ["--task"] * (args.task is not None) + [settings.flag(k) for k in engine] + \
            ["--served-model-name"] * (args.served_model_name is not None)
        raise ValueError(f"{', '.join(given)} go with a model (MODEL or --model_path); with "
                         "--config-file set them per endpoint (task, name, kwargs)")
    return ServerConfig.load(args.config_file, settings=settings, **overrides)
