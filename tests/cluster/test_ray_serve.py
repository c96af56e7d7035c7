"""The Ray Serve application (`sparsellm.cluster.serve:app`) on a local Ray instance: two
replicas of one thread each behind the router, driven by the `openai` client from concurrent
threads, answer exactly as one process does; both replicas serve; /metrics shows each replica;
killing a replica under load loses no request: every non-streamed request and every stream that
had not sent an event is retried on the other replica and answers as one process does, a stream
already under way ends with an OpenAI-shaped error event, and Serve brings the replica back."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
import types
from dataclasses import dataclass
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
SHORT, LONG, LONGEST = 16, 64, 384  # tokens of the plain tests' completions, the kill test's
KILL_LOAD = [(PROMPTS[i % len(PROMPTS)], LONG if i % 2 else LONGEST, i % 2 == 1)
             for i in range(32)]  # the kill test's (prompt, tokens, streamed)


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
def single_process(tiny_llama_dir) -> dict[tuple[str, int], str]:
    """Greedy completions from the server's app in this process: {(prompt, tokens): text} of
    PROMPTS in SHORT tokens and of the kill test's requests."""
    import asyncio

    async def run() -> dict[tuple[str, int], str]:
        server = LocalServer(ServerConfig(endpoints=[{"model": str(tiny_llama_dir),
                                                      "name": "tiny"}]))
        await server.start()
        texts = {}
        try:
            for key in [*((p, SHORT) for p in PROMPTS), *((p, t) for p, t, _ in KILL_LOAD)]:
                if key not in texts:
                    reply = await server.request("POST", "/v1/completions", _body(*key))
                    texts[key] = reply.json()["choices"][0]["text"]
        finally:
            server.stop()
        return texts

    return asyncio.run(run())


def _body(prompt: str, tokens: int = SHORT, stream: bool = False) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}


def complete(url: str, prompt: str, stream: bool = False) -> tuple[str, str | None]:
    """(text, replica that answered) of a greedy completion through the openai client."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    args = dict(model="tiny", prompt=prompt, max_tokens=SHORT, temperature=0,
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
    expected = [single_process[p, SHORT] for p in PROMPTS]
    assert [text for text, _ in plain] == expected
    assert [text for text, _ in streamed] == expected
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


@dataclass
class Outcome:
    """One request of the kill test, as its client saw it."""
    stream: bool
    status: int
    replica: str | None
    retried: int  # replicas that died before answering it (the router's x-sparsellm-retried)
    text: str  # the completion, or what a cut stream had sent
    error: dict | None = None  # a stream's error event, or a status's error body
    events: int = 0  # a stream's completion chunks


def test_killing_a_replica_under_load(deployment, ray_cluster, single_process, capsys):
    """32 requests at once: 16 streamed of 64 tokens, 16 non-streamed of 384 (seconds of work
    for each replica's 4 slots, so the victim still holds some when the kill comes); once 4
    requests have finished (Serve has handed out the rest) and a stream from one replica is
    under way, that replica is killed. Every non-streamed request and every stream that had
    not sent an event completes with the single-process text (on the other replica, when it
    was the dead one's: the router's retry, counted by x-sparsellm-retried); a stream the dead
    replica had started ends with an OpenAI-shaped error event after a prefix of that text.
    At least one request was retried. Serve then runs two replicas again."""
    victim = complete(deployment, "warm up")[1]
    under_way = threading.Event()  # 4 requests are done, a stream from the victim under way

    def kill() -> int:
        under_way.wait(timeout=300)  # else the kill comes late, and the count check says so
        ray_cluster.kill(ray_cluster.get_actor(f"SERVE_REPLICA::{APP}#ModelReplica#{victim}",
                                               namespace="serve"), no_restart=False)
        return sum(1 for o in outcomes if o is not None)

    def request(i: int) -> Outcome:
        body = _body(*KILL_LOAD[i])
        stream = body["stream"]
        with httpx.Client(timeout=600) as client, \
                client.stream("POST", deployment + "/v1/completions", json=body) as r:
            outcome = Outcome(stream, r.status_code, r.headers.get("x-sparsellm-replica"),
                              int(r.headers.get("x-sparsellm-retried", "0")), "")
            if r.status_code != 200 or not stream:
                data = json.loads(r.read())
                if r.status_code != 200:
                    outcome.error = data
                else:
                    outcome.text = data["choices"][0]["text"]
                outcomes[i] = outcome
                return outcome
            events = []
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line.removeprefix("data: "))
                if events[-1] == "[DONE]":
                    break
                event = json.loads(events[-1])
                if "error" in event:
                    outcome.error = event
                else:
                    outcome.text += event["choices"][0]["text"]
                    outcome.events += 1
                    if outcome.replica == victim and sum(o is not None for o in outcomes) >= 4:
                        under_way.set()
            assert events[-1] == "[DONE]", f"request {i}: the stream ended without [DONE]"
        outcomes[i] = outcome
        return outcome

    outcomes: list[Outcome | None] = [None] * 32
    with concurrent.futures.ThreadPoolExecutor(33) as pool:
        killed = pool.submit(kill)
        results = list(pool.map(request, range(32)))
        finished_before_kill = killed.result()  # the kill itself raised nothing
    retried = [i for i, o in enumerate(results) if o.retried]
    cut = [i for i, o in enumerate(results) if o.error is not None]
    report = (f"replica kill under load: {len(retried)} of 32 requests retried on another "
              f"replica ({sum(o.retried for o in results)} dead replicas met), {len(cut)} "
              f"started streams ended with an error event; the kill came after "
              f"{finished_before_kill} had finished; answered by the killed replica "
              f"{sum(o.replica == victim for o in results)}, by the other "
              f"{sum(o.replica != victim for o in results)}")
    with capsys.disabled():
        print("\n" + report)
    for i, (o, (prompt, tokens, _)) in enumerate(zip(results, KILL_LOAD, strict=True)):
        want = single_process[prompt, tokens]
        assert o.status == 200, (i, o, report)
        if o.error is None:  # a request that had not started streaming completed in full
            assert o.text == want and o.replica is not None, (i, o, report)
            assert not o.retried or o.replica != victim, (i, o, report)
            continue
        # only a stream the dead replica had started may end early, with an error event in
        # OpenAI's shape after at least one chunk of the single-process text
        assert o.stream and o.replica == victim and o.events >= 1, (i, o, report)
        assert set(o.error["error"]) == {"message", "type", "param", "code"}, (i, o)
        assert o.error["error"]["type"] == "service_unavailable", (i, o)
        assert want.startswith(o.text), (i, o, report)
    assert retried, f"no request was retried: {report}"
    assert finished_before_kill < 32, report
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


class _DyingReplicas:
    """A stand-in for the router's handle: the first `deaths` calls die before answering (or,
    with `after_start`, between the reply's start and its body), the others answer."""

    def __init__(self, deaths: int, after_start: bool = False):
        self.deaths, self.after_start, self.calls = deaths, after_start, 0

    def remote(self, method: str, path: str, body: bytes, headers: dict) -> object:
        self.calls += 1
        dies = self.calls <= self.deaths
        after_start = self.after_start

        async def messages():
            from ray.exceptions import ActorDiedError
            if dies and not after_start:
                raise ActorDiedError()
            yield {"type": "http.response.start", "status": 200,
                   "headers": [(b"content-type", b"application/json")]}
            if dies:
                raise ActorDiedError()
            yield {"type": "http.response.body", "body": b'{"ok": true}', "more_body": False}

        return messages()


@pytest.mark.parametrize("deaths, after_start, status, retried", [
    (0, False, 200, None), (1, False, 200, "1"), (3, True, 200, "3"), (4, False, 503, "4")])
def test_the_router_retries_a_request_whose_replica_died_before_answering(
        deaths, after_start, status, retried):
    """Up to RETRIES replicas may die before answering: the request goes to the next one and
    the answer says how many died (x-sparsellm-retried); one more is a 503 in OpenAI's shape."""
    import asyncio

    from starlette.requests import Request

    from sparsellm.cluster.serve import RETRIES, Router

    assert RETRIES == 3
    router = types.SimpleNamespace(replicas=_DyingReplicas(deaths, after_start))

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    request = Request({"type": "http", "method": "POST", "path": "/v1/completions",
                       "headers": [], "query_string": b""}, receive)
    response = asyncio.run(Router.func_or_class.forward(router, request, "v1/completions"))
    assert response.status_code == status
    assert response.headers.get("x-sparsellm-retried") == retried
    assert router.replicas.calls == min(deaths, RETRIES + 1) + (status == 200)
    if status == 503:
        assert json.loads(response.body)["error"]["type"] == "service_unavailable"
        assert response.headers["retry-after"] == "2"
    else:
        assert response.body == b'{"ok": true}'


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
