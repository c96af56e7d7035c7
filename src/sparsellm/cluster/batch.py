"""`sparsellm batch --ray`: the rows fanned out over a Ray cluster with Ray Data, one engine per
worker (an actor holding a `LocalServer`), results handed back in input order.

A worker that dies (its process killed, its node gone) is restarted, its engine loaded again,
and the blocks of rows it had not handed back run again on it: Ray Data's actor pool asks Ray
for that by default (`max_restarts=-1`, `max_task_retries=-1`; `map_batches` would take other
values only through its deprecated `ray_remote_args`) and hands each block's records to the
driver once, in input order, so a row the dead worker had begun is neither lost nor written
twice (`tests/cluster/test_ray_batch.py` kills a worker mid-run). A worker that keeps failing
to start fails the run. The driver writes each record as it arrives, so a driver that dies
leaves a valid prefix that the next run skips (`server.batch.run_batch`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

from ..server.batch import BatchRow, run_rows
from ..server.config import ServerConfig
from ..server.local import LocalServer
from . import connect, worker_count


class BatchWorker:
    """One engine on a Ray worker; each call runs a block of rows through it concurrently."""

    def __init__(self, config: dict[str, Any], model: str, window: int):
        self.model, self.window = model, window
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="batch-worker", daemon=True).start()
        self.server = LocalServer(ServerConfig.model_validate(config))
        self._run(self.server.start())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        rows = [BatchRow(**json.loads(r)) for r in batch["row"]]

        async def records() -> list[dict[str, Any]]:
            return [r async for r in run_rows(self.server, rows, self.model, self.window)]

        return {"record": [json.dumps(r, ensure_ascii=False) for r in self._run(records())]}


def run_on_ray(server_config: ServerConfig, model: str, rows: list[BatchRow],
               address: str | None = None, workers: int | None = None
               ) -> Iterator[dict[str, Any]]:
    """Records of `rows` in input order, computed by `workers` engines of
    `server_config.num_cores` threads each (default: as many as the cluster's CPUs hold)."""
    ray = connect(address)
    threads = server_config.num_cores or 1
    workers = worker_count(ray, threads, workers)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False  # the command shows its own
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    slots = server_config.max_concurrent_requests
    config = server_config.model_copy(update={"num_cores": threads}).model_dump()
    dataset = ray.data.from_items(
        [{"row": json.dumps(dataclasses.asdict(r))} for r in rows],
        override_num_blocks=max(1, min(len(rows), 8 * workers)))
    results = dataset.map_batches(
        BatchWorker, fn_constructor_kwargs={"config": config, "model": model,
                                            "window": 4 * slots},
        batch_size=4 * slots, compute=ray.data.ActorPoolStrategy(size=workers),
        num_cpus=threads)
    for item in results.iter_rows():
        yield json.loads(item["record"])
