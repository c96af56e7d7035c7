"""One local Ray instance for the cluster tests: 2 logical CPUs, as this machine has cores."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")


@pytest.fixture(scope="session")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield ray
    ray.shutdown()
