"""The server as a Ray Serve application: the same HTTP surface as `sparsellm serve`, served by
as many replicas as Serve runs, each one engine with its own threads.

    serve run sparsellm.cluster.serve:app model=./pruned50-quant num_replicas=2 num_cores=1
    serve run serve_config.yaml   # import_path: sparsellm.cluster.serve:app, args: {...}

The arguments are `sparsellm serve`'s options (model, served_model_name, config_file,
max_concurrent_requests, weights, kv_cache_dtype, draft_model, ...; with `_` for `-`), checked
by the same code with the same errors (`server/options.py`; the engine settings' come from
`EngineSettings`), plus `num_replicas`. Serve's config file may set the
`ModelReplica` deployment's `num_replicas`, `autoscaling_config` and `ray_actor_options`
(`num_cpus` is then a replica's thread count unless `num_cores` is given).

Two deployments: `Router`, the HTTP ingress (no CPU of its own), forwards each request to a
`ModelReplica`, which runs it through the server's app in its process (`LocalServer`) and
streams the ASGI messages back. A replica that dies before sending a byte of its answer (every
non-streamed request, a stream before its first event) is replaced by Serve and the request
goes to another replica (up to `RETRIES` times, then a 503 in OpenAI's shape with Retry-After);
one that dies in the middle of a stream ends that stream with an error event in OpenAI's shape
(`service_unavailable`), then `[DONE]`. Responses carry `x-sparsellm-replica`, the replica that
answered, and `x-sparsellm-retried`, how many replicas died before it (when any did).
"""

# No `from __future__ import annotations`: FastAPI reads the route's parameter types from the
# class Serve rebuilds, where string annotations do not resolve.
import argparse
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle
from starlette.types import Message

from ..server import options as serve_options
from ..server.config import ServerConfig
from ..server.errors import error_bytes
from ..server.local import LocalServer

log = logging.getLogger("sparsellm.server")
RETRIES = 3  # times one request is sent again after its replica died before answering
PUBLISH_SECONDS = 1.0  # how often a replica hands its metrics to the board
STALE_SECONDS = 10.0  # a replica silent for longer (gone) leaves /metrics
REPLICA_HEADER = "x-sparsellm-replica"
RETRIED_HEADER = "x-sparsellm-retried"  # replicas that died before answering this request
NOT_ARGS = {"host", "port", "drain_timeout"}  # Serve's own settings (http_options, shutdown)
_REPLICA_GONE = (RayActorError, ActorDiedError, ActorUnavailableError)


@ray.remote(num_cpus=0)
class MetricsBoard:
    """The latest Prometheus text of each replica (what the router's /metrics shows)."""

    def __init__(self) -> None:
        self.texts: dict[str, tuple[float, str]] = {}

    def put(self, replica: str, text: str) -> None:
        self.texts[replica] = (time.monotonic(), text)

    def get(self) -> dict[str, str]:
        now = time.monotonic()
        self.texts = {r: v for r, v in self.texts.items() if now - v[0] < STALE_SECONDS}
        return {r: text for r, (_, text) in sorted(self.texts.items())}


def metrics_board(app_name: str) -> Any:
    """The application's board (created by whichever process asks first; a new one if the
    process that owned it died)."""
    return MetricsBoard.options(name=f"{app_name}-metrics", get_if_exists=True,
                                namespace="serve").remote()


def merge_metrics(texts: dict[str, str], label: str = "replica") -> str:
    """Several processes' Prometheus texts as one: each sample gets `label="<its process>"`,
    each metric family's samples stay together under one HELP and TYPE."""
    families: dict[str, list[str]] = {}  # family -> its HELP/TYPE lines, then samples
    for source, text in texts.items():
        family = ""
        for line in text.splitlines():
            if line.startswith("#"):
                family = line.split()[2]
                if family in families and len(families[family]) < 2:
                    families[family].append(line)
                families.setdefault(family, [line])
                continue
            if not line.strip():
                continue
            name, _, rest = line.partition("{")
            tag = f'{label}="{source}"'
            if rest:
                line = f"{name}{{{tag},{rest}"
            else:
                name, _, value = line.partition(" ")
                line = f"{name}{{{tag}}} {value}"
            families.setdefault(family, []).append(line)
    return "".join(line + "\n" for lines in families.values() for line in lines)


@serve.deployment(ray_actor_options={"num_cpus": 1})
class ModelReplica:
    """One engine: the server's app in this replica's process."""

    def __init__(self, config: dict[str, Any]):
        server_config = ServerConfig.model_validate(config)
        if server_config.num_cores is None:  # the CPUs Serve gave this replica
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
            server_config = server_config.model_copy(update={"num_cores": max(1, int(cpus))})
        context = serve.get_replica_context()
        self.name, self.app_name = context.replica_id.unique_id, context.app_name
        self.server = LocalServer(server_config)
        self.server.load()  # the replica is ready (routed to) once its model is loaded
        threading.Thread(target=self._publish, name="metrics", daemon=True).start()

    def _publish(self) -> None:
        board = None
        while True:
            try:
                board = board or metrics_board(self.app_name)
                ray.get(board.put.remote(self.name, self.server.metrics_text()))
            except Exception as e:  # noqa: BLE001 -- e.g. the board went with its owner
                log.debug("publishing metrics failed (%r); asking for the board again", e)
                board = None
            time.sleep(PUBLISH_SECONDS)

    async def handle(self, method: str, path: str, body: bytes,
                     headers: dict[str, str]) -> AsyncIterator[Message]:
        async for message in self.server.stream(method, path, body, headers):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (REPLICA_HEADER.encode(), self.name.encode())]}
            yield message


def _response(start: Message, first: Message, messages: AsyncIterator[Message]) -> Response:
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start["headers"]
               if k.lower() != b"content-length"}
    if not first.get("more_body", False):  # a whole body (every non-streamed reply)
        return Response(first.get("body", b""), status_code=start["status"], headers=headers)

    async def rest() -> AsyncIterator[bytes]:
        yield first.get("body", b"")
        try:
            async for message in messages:
                yield message.get("body", b"")
        except Exception as e:  # noqa: BLE001 -- the stream has started: end it with an event
            gone = isinstance(e, _REPLICA_GONE)
            log.warning("a stream ended early: %s", "its replica died" if gone else repr(e))
            status = 503 if gone else 500
            message = "the replica serving this stream stopped; retry the request" if gone \
                else "internal server error"
            yield b"data: " + error_bytes(status, message) + b"\n\ndata: [DONE]\n\n"

    return StreamingResponse(rest(), status_code=start["status"], headers=headers)


ingress = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)


@ingress.exception_handler(Exception)
async def _unexpected(request: Request, e: Exception) -> Response:
    """Anything the router did not expect is still an error in OpenAI's shape: a 503 (retry)
    when the replicas could not be reached, else a 500."""
    log.error("%s %s failed in the router: %r", request.method, request.url.path, e)
    status = 503 if isinstance(e, (*_REPLICA_GONE, RayServeException)) else 500
    message = "no replica could answer; retry shortly" if status == 503 \
        else "internal server error"
    return Response(error_bytes(status, message), status_code=status,
                    media_type="application/json",
                    headers={"Retry-After": "2"} if status == 503 else None)


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000)
@serve.ingress(ingress)
class Router:
    """The HTTP ingress: every route is the replicas' (their app answers 404 for unknown
    ones)."""

    def __init__(self, replicas: DeploymentHandle):
        self.replicas = replicas.options(stream=True, method_name="handle")
        self.app_name = serve.get_replica_context().app_name

    @ingress.get("/metrics", include_in_schema=False)
    async def metrics(self, request: Request) -> Response:
        """Every live replica's metrics, each sample labelled with its replica (the
        replicas' API key applies: checked by one of them)."""
        check = self.replicas.remote("GET", "/metrics", b"", dict(request.headers))
        start, first = await anext(check), await anext(check)
        if start["status"] != 200:
            return _response(start, first, check)
        try:
            texts = await metrics_board(self.app_name).get.remote()
        except RayActorError:  # its owner just died; the replicas fill a new one within a second
            texts = {}
        return PlainTextResponse(merge_metrics(texts),
                                 media_type="text/plain; version=0.0.4")

    @ingress.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE",
                                                 "HEAD", "OPTIONS"], include_in_schema=False)
    async def forward(self, request: Request, path: str) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k != "content-length"}
        retried = 0  # replicas that died before sending a byte of this request's answer
        while True:
            messages = self.replicas.remote(request.method, "/" + path, body, headers)
            # a non-streamed reply is these two messages, a stream its start and first event:
            # both arrived, or the replica died before the client saw a byte and we retry
            try:
                start, first = await anext(messages), await anext(messages)
            except _REPLICA_GONE as e:
                retried += 1
                if retried > RETRIES:
                    break
                log.warning("a replica died before answering %s /%s (%s); retrying on another "
                            "(%d of %d)", request.method, path, type(e).__name__, retried,
                            RETRIES)
                continue
            if retried:
                start = {**start, "headers": [*start.get("headers", []),
                                              (RETRIED_HEADER.encode(), str(retried).encode())]}
            return _response(start, first, messages)
        return Response(error_bytes(503, "no replica could answer (replicas are restarting); "
                                         "retry shortly"), status_code=503,
                        media_type="application/json",
                        headers={"Retry-After": "2", RETRIED_HEADER: str(retried)})


class _ArgumentError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ArgumentError(message)


def server_config(args: dict[str, Any]) -> ServerConfig:
    """`serve run` arguments (or a Serve config file's `args`) -> the ServerConfig that
    `sparsellm serve` would build from the same options; errors name the argument."""
    parser = _Parser(prog="sparsellm.cluster.serve:app")
    serve_options.add_arguments(parser)
    flags: dict[str, argparse.Action] = {}
    off: dict[str, argparse.Action] = {}  # a flag that sets a value to False (--no-weights-cache)
    for a in parser._actions:
        if a.dest in ("help", *NOT_ARGS):
            continue
        if isinstance(a, argparse._StoreConstAction) and a.const is False:
            off[a.dest] = a
        flags.setdefault(a.dest, a)
    unknown = set(args) - set(flags)
    if unknown:
        raise ValueError(f"unknown argument(s) {sorted(unknown)} for sparsellm.cluster.serve:app;"
                         f" accepted: num_replicas, {', '.join(sorted(flags))} (host and port "
                         "are Serve's http_options)")
    argv: list[str] = []
    for key, value in args.items():
        action = flags[key]
        if key in off and str(value).lower() in ("0", "false", "no"):
            argv.append(off[key].option_strings[0])
        elif not action.option_strings:  # the positional MODEL
            argv.append(str(value))
        elif isinstance(action, argparse.BooleanOptionalAction):
            on = str(value).lower() in ("1", "true", "yes")
            argv.append(action.option_strings[0] if on else action.option_strings[1])
        elif action.nargs == 0:  # store_true
            if str(value).lower() in ("1", "true", "yes"):
                argv.append(action.option_strings[0])
        else:
            argv += [action.option_strings[0], str(value)]
    try:
        namespace = parser.parse_args(argv)
    except _ArgumentError as e:
        raise ValueError(f"sparsellm.cluster.serve:app: {e}") from None
    return serve_options.server_config(namespace)


def app(args: dict[str, Any]) -> serve.Application:
    """The application builder `serve run` calls with its key=value arguments."""
    args = dict(args)
    replicas = args.pop("num_replicas", 1)
    try:
        replicas = int(replicas)
    except ValueError:
        raise ValueError(f"num_replicas must be an integer, got {replicas!r}") from None
    if replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, got {replicas}")
    config = server_config(args)
    options: dict[str, Any] = {"num_replicas": replicas,
                               "max_ongoing_requests": 2 * config.max_concurrent_requests}
    if config.num_cores is not None:
        options["ray_actor_options"] = {"num_cpus": config.num_cores}
    replica = ModelReplica.options(**options).bind(config.model_dump())
    return Router.bind(replica)
