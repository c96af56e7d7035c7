"""Real server processes (`python -m sparsellm.cli serve ...`) on free loopback ports, serving
the tiny random Llama from tests/conftest.py."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from sparsellm.server.loadtest import free_port, wait_healthy
from subprocess_env import subprocess_env

API_KEY = "test-key-123"


class ServerProcess:
    def __init__(self, args: list[str], log_path: Path, entry: list[str] | None = None,
                 api_key: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log_path = log_path
        env = subprocess_env()
        env.pop("SPARSELLM_API_KEY", None)
        cmd = (entry or [sys.executable, "-m", "sparsellm.cli"]) + \
            ["serve", "--port", str(self.port), "--log-level", "warning", *args]
        self.log = open(log_path, "w")  # noqa: SIM115 -- closed in stop()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=60, **kwargs)

    def wait_ready(self, timeout: float = 60) -> ServerProcess:
        wait_healthy(self.url, self.proc, timeout, self.log_path)
        return self

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", headers=self.headers, timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def write_config(path: Path, model: Path, **kwargs) -> Path:
    endpoints = kwargs.pop("endpoints", None) or [{
        "task": "text-generation", "model": str(model), "name": "tiny", "route": "/generate",
        "kwargs": {"sequence_length": 2048, "max_generated_tokens": 16},
    }]
    path.write_text(yaml.safe_dump({"endpoints": endpoints, **kwargs}))
    return path


@pytest.fixture(scope="session")
def start_server(tmp_path_factory) -> Iterator[Callable[..., ServerProcess]]:
    """start_server(args, entry=None, api_key=None, wait=True) -> a running ServerProcess."""
    started: list[ServerProcess] = []

    def start(args: list[str], entry: list[str] | None = None, api_key: str | None = None,
              wait: bool = True) -> ServerProcess:
        log = tmp_path_factory.mktemp("server") / "server.log"
        server = ServerProcess(args, log, entry, api_key)
        started.append(server)
        return server.wait_ready() if wait else server

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def server(start_server, tiny_llama_dir, tmp_path_factory) -> ServerProcess:
    """The shared server: tiny model at /predict, /generate and /v1 (no API key)."""
    config = write_config(tmp_path_factory.mktemp("cfg") / "config.yaml", tiny_llama_dir,
                          max_concurrent_requests=4, max_queue=32)
    return start_server(["--config-file", str(config)])


def sse_events(lines: Iterator[str]) -> Iterator[dict | str]:
    """Parse `data:` lines of a server-sent event stream; yields dicts and the final "[DONE]"."""
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            yield data if data == "[DONE]" else json.loads(data)


def metric(metrics: dict[str, float], pattern: str) -> float:
    return sum(v for k, v in metrics.items() if re.fullmatch(pattern, k))
