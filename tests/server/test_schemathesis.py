"""Property-based API testing: schemathesis against the server's own /openapi.json."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from .conftest import write_config

pytest.importorskip("schemathesis")


@pytest.mark.slow
def test_schemathesis_finds_no_server_errors(start_server, tiny_llama_dir, tmp_path):
    config = write_config(tmp_path / "c.yaml", tiny_llama_dir, max_queue=256, endpoints=[{
        "model": str(tiny_llama_dir), "name": "tiny", "route": "/generate",
        "kwargs": {"sequence_length": 256, "max_generated_tokens": 16}}])
    srv = start_server(["--config-file", str(config)])
    st = shutil.which("schemathesis") or shutil.which("st")
    cmd = [st] if st else [sys.executable, "-m", "schemathesis.cli"]
    proc = subprocess.run(
        [*cmd, "run", srv.url + "/openapi.json", "--max-examples", "50", "--workers", "2",
         "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                     "response_schema_conformance",
         "--request-timeout", "30", "--suppress-health-check", "all", "--no-color"],
        capture_output=True, text=True, timeout=600)
    report = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    assert "No issues found" in proc.stdout, report
    assert "Tested: 7" in proc.stdout, report  # /predict, /generate, 3 /v1, health, metrics
