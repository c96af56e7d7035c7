"""Beyond one machine, on a Ray cluster (`pip install "sparsellm[ray]"`): the server as a Ray
Serve application (`serve.py`), batch generation fanned out with Ray Data (`batch.py`) and
evaluation spread over workers (`evaluate.py`). Nothing else in the package imports Ray."""

from __future__ import annotations

from typing import Any


def connect(address: str | None = None) -> Any:
    """The `ray` module, connected: to the cluster at `address` ("auto": the one this machine
    belongs to), else to $RAY_ADDRESS or a new local instance. A clear error without Ray."""
    try:
        import ray
    except ImportError:
        raise ValueError('running on Ray needs Ray: pip install "sparsellm[ray]"') from None
    if not ray.is_initialized():
        ray.init(address=address, logging_level="WARNING", log_to_driver=False,
                 include_dashboard=False)
    return ray


def worker_count(ray: Any, threads: int, workers: int | None = None) -> int:
    """`workers`, else as many engines of `threads` threads as the cluster's CPUs hold."""
    return workers or max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
