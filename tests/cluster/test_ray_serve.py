"""The Ray Serve application (`sparsellm.cluster.serve:app`) on a local Ray instance: two
replicas of one thread each behind the router, driven by the `openai` client from concurrent
threads, answer exactly as one process does; both replicas serve; /metrics shows each replica;
killing a replica under load loses no request without a retryable, OpenAI-shaped error, and
Serve brings the replica back."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import httpx
import pytest

from server.conftest import free_port
from sparsellm.server.config import ServerConfig
from sparsellm.server.local import LocalServer

openai = pytest.importorskip("openai")
serve = pytest.importorskip("ray.serve")

from sparsellm.cluster.serve import app, merge_metrics, server_config  # noqa: E402
from sparsellm.engine import EngineSettings  # noqa: E402

pytestmark = pytest.mark.slow  # a Ray instance, replicas and workers to start

PROMPTS = [f"{w} {i}" for i, w in enumerate(["def f(x):", "import os", "class A:", "x = [1,",
                                             "for i in", "# note", "print(", "return"] * 3)]
APP = "sparsellm"


@pytest.fixture(scope="module")
def deployment(ray_cluster, tiny_llama_dir):
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(app({"model": str(tiny_llama_dir), "served_model_name": "tiny",
                   "num_replicas": 2, "num_cores": 1, "max_concurrent_requests": 4}),
              name=APP, route_prefix="/")
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()


@pytest.fixture(scope="module")
def single_process(tiny_llama_dir):
    """Greedy completions of PROMPTS from the server's app in this process."""
    import asyncio

    async def run() -> list[str]:
        server = LocalServer(ServerConfig(endpoints=[{"model": str(tiny_llama_dir),
                                                      "name": "tiny"}]))
        await server.start()
        try:
            replies = [await server.request("POST", "/v1/completions", _body(p))
                       for p in PROMPTS]
        finally:
            server.stop()
        return [r.json()["choices"][0]["text"] for r in replies]

    return asyncio.run(run())


def _body(prompt: str) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0,
            "ignore_eos": True}


def complete(url: str, prompt: str, stream: bool = False) -> tuple[str, str | None]:
    """(text, replica that answered) of a greedy completion through the openai client."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    args = dict(model="tiny", prompt=prompt, max_tokens=16, temperature=0,
                extra_body={"ignore_eos": True})
    if stream:
        raw = client.completions.with_raw_response.create(stream=True, **args)
        chunks = [c for c in raw.parse() if c.choices]
        return "".join(c.choices[0].text for c in chunks), raw.headers.get("x-sparsellm-replica")
    raw = client.completions.with_raw_response.create(**args)
    return raw.parse().choices[0].text, raw.headers.get("x-sparsellm-replica")


def running_replicas() -> int:
    status = serve.status().applications[APP].deployments["ModelReplica"]
    return status.replica_states.get("RUNNING", 0)


def controller_log(ray_module, lines: int = 30) -> str:
    """The end of Serve's controller log (what it did with the replicas), for a failure."""
    folder = Path(ray_module._private.worker._global_node.get_session_dir_path()) / "logs/serve"
    text = "".join(p.read_text(errors="replace") for p in sorted(folder.glob("controller_*.log")))
    return "\n".join(["Serve's controller log ends:",
                      *[line for line in text.splitlines() if " DEBUG " not in line][-lines:]])


def test_two_replicas_answer_as_one_process(deployment, single_process):
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        plain = list(pool.map(lambda p: complete(deployment, p), PROMPTS))
        streamed = list(pool.map(lambda p: complete(deployment, p, True), PROMPTS))
    assert [text for text, _ in plain] == single_process
    assert [text for text, _ in streamed] == single_process
    replicas = {r for _, r in plain + streamed}
    assert len(replicas) == 2 and None not in replicas


def test_health_errors_and_metrics_of_each_replica(deployment):
    assert httpx.get(deployment + "/health").json() == {"status": "ok", "detail": None}
    bad = httpx.post(deployment + "/v1/completions", json={"model": "tiny", "prompt": "x",
                                                          "max_tokens": -1})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "max_tokens"
    missing = httpx.post(deployment + "/v1/completions", json={"model": "other", "prompt": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert httpx.get(deployment + "/no/such/route").status_code == 404
    assert httpx.get(deployment + "/openapi.json").json()["info"]["title"] == "sparsellm"
    time.sleep(1.5)  # the replicas publish their metrics every second
    text = httpx.get(deployment + "/metrics").text
    served = [line for line in text.splitlines()
              if line.startswith('sparsellm_requests_total{replica="')
              and 'route="/v1/completions",status="200"' in line]
    assert len({line.split('"')[1] for line in served}) == 2
    assert text.count("# TYPE sparsellm_requests_total counter") == 1


def test_killing_a_replica_under_load(deployment, ray_cluster):
    """Every request completes or gets a retryable error in OpenAI's shape (a 503, or an error
    event ending a stream); Serve then runs two replicas again."""
    victim = complete(deployment, "warm up")[1]

    def kill() -> None:
        time.sleep(0.5)
        ray_cluster.kill(ray_cluster.get_actor(f"SERVE_REPLICA::{APP}#ModelReplica#{victim}",
                                               namespace="serve"), no_restart=False)

    def request(i: int) -> tuple[str, object]:
        body = {"model": "tiny", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 64,
                "temperature": 0, "ignore_eos": True, "stream": i % 2 == 1}
        with httpx.Client(timeout=60) as client:
            r = client.post(deployment + "/v1/completions", json=body)
        if r.status_code != 200:
            return "status", (r.status_code, r.json())
        if body["stream"]:
            events = [line.removeprefix("data: ") for line in r.text.split("\n\n") if line]
            assert events[-1] == "[DONE]"
            errors = [e for e in events if e.startswith('{"error"')]
            return ("error event", errors) if errors else ("ok", None)
        return "ok", r.json()["choices"][0]["text"]

    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        killed = pool.submit(kill)
        results = list(pool.map(request, range(32)))
        killed.result()  # the kill itself raised nothing
    for kind, detail in results:
        if kind == "status":
            status, body = detail
            assert status == 503 and body["error"]["type"] == "service_unavailable"
        elif kind == "error event":
            assert all('"service_unavailable"' in e for e in detail)
    assert sum(kind == "ok" for kind, _ in results) >= 16
    # Serve notices the death at its next health check (every 10 s) and starts a replacement
    # (4-12 s here); until the router routes to it, the survivor answers everything
    deadline = time.monotonic() + 180
    answered_by: set[str | None] = set()
    while len(answered_by) < 2 and time.monotonic() < deadline:
        answered_by.add(complete(deployment, PROMPTS[0])[1])
        time.sleep(0.5)  # the replacement starts on these 2 cores too
    assert victim not in answered_by and len(answered_by) == 2, controller_log(ray_cluster)
    assert running_replicas() == 2, controller_log(ray_cluster)
    # /metrics shows the live replicas only (the dead one's last figures expire; the board is
    # recreated if it died with its owner)
    labels: set[str] = set()
    while labels != answered_by and time.monotonic() < deadline + 60:
        time.sleep(1)
        text = httpx.get(deployment + "/metrics").text
        labels = {line.split('"')[1] for line in text.splitlines()
                  if line.startswith('sparsellm_requests_total{replica="')}
    assert labels == answered_by


@pytest.mark.parametrize("args, message", [
    ({"model": "m", "colour": "red"}, "unknown argument(s) ['colour']"),
    ({"model": "m", "port": 1}, "unknown argument(s) ['port']"),
    ({"model": "m", "num_replicas": "two"}, "num_replicas must be an integer"),
    ({"model": "m", "num_replicas": 0}, "num_replicas must be at least 1"),
    ({"model": "m", "max_concurrent_requests": "many"}, "invalid int value: 'many'"),
    ({"model": "m", "model_path": "n"}, "two models given"),
    ({"model": "m", "kv_cache_dtype": "int3"}, "invalid choice: 'int3'"),
    ({"model": "m", "max_concurrent_requests": 0}, "max_concurrent_requests"),
])
def test_builder_arguments_are_checked_as_the_cli_checks_them(args, message):
    with pytest.raises(ValueError) as e:
        app(args)
    assert message in str(e.value)


def test_builder_arguments_reach_the_engine_settings():
    """The engine settings' flags as Serve arguments, named as the CLI's (draft_model for
    --draft-model); weights_cache false is --no-weights-cache, not a folder called False."""
    config = server_config({"model": "m", "draft_model": "auto", "weights_cache": False,
                            "prompt_lookup": "true", "num_speculative_tokens": "3"})
    assert config.endpoints[0].settings == EngineSettings(
        model_path="m", draft_model_path="auto", weights_cache=False, prompt_lookup=True,
        num_speculative_tokens=3)
    assert server_config({"model": "m", "weights_cache": "/tmp/c"}).endpoints[0] \
        .settings.weights_cache == "/tmp/c"


def test_merged_metrics_keep_each_family_together():
    a = "# HELP x_total x\n# TYPE x_total counter\nx_total{m=\"a\"} 1\n# TYPE g gauge\ng 2\n"
    b = "# HELP x_total x\n# TYPE x_total counter\nx_total{m=\"a\"} 3\n# TYPE g gauge\ng 4\n"
    assert merge_metrics({"r1": a, "r2": b}).splitlines() == [
        "# HELP x_total x", "# TYPE x_total counter",
        'x_total{replica="r1",m="a"} 1', 'x_total{replica="r2",m="a"} 3',
        "# TYPE g gauge", 'g{replica="r1"} 2', 'g{replica="r2"} 4']


def test_the_example_serve_config_is_valid():
    """examples/ray_serve.yaml passes Serve's own schema and its args build the application."""
    import yaml
    from ray.serve.schema import ServeDeploySchema

    path = Path(__file__).resolve().parents[2] / "examples" / "ray_serve.yaml"
    config = ServeDeploySchema.model_validate(yaml.safe_load(path.read_text()))
    (application,) = config.applications
    assert application.import_path == "sparsellm.cluster.serve:app"
    assert [d.name for d in application.deployments] == ["ModelReplica"]
    assert isinstance(app(application.args), serve.Application)
