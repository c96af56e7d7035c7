"""`sparsellm eval --ray`: an evaluation's parts (perplexity samples, HumanEval problems) as Ray
tasks, one per worker, each loading the model by its path on whichever node runs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from . import connect, worker_count

T = TypeVar("T")
RETRIES = 3  # a task whose worker died runs again


class RayWorkers:
    """`sparsellm.evaluation.Workers` on a Ray cluster: `count` tasks of `threads` CPUs each
    (default: as many as the cluster's CPUs hold)."""

    def __init__(self, address: str | None = None, count: int | None = None, threads: int = 1):
        self.ray = connect(address)
        self.threads = threads
        self.count = worker_count(self.ray, threads, count)

    def map(self, fn: Callable[..., T], args: list[tuple[Any, ...]],
            on_done: Callable[[int], None]) -> list[T]:
        task = self.ray.remote(num_cpus=self.threads, max_retries=RETRIES)(fn)
        refs = [task.remote(*a) for a in args]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            on_done(index[done[0]])
        return self.ray.get(refs)
