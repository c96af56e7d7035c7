"""Batch generation over a file of requests: each row goes through the server's own routes
(`LocalServer`), so a row's result is what the HTTP server would have answered.

Two input forms, told apart by the first non-blank line:
- the OpenAI Batch API's (what vLLM's `run_batch` reads): JSON lines
  `{"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions", "body"}`;
  each output line is `{"id", "custom_id", "response": {"status_code", "request_id", "body"},
  "error"}`, `error` being the body's error object when the request failed;
- plain text, one prompt per line (blank lines skipped): each output line is
  `{"index", "prompt", "text", "finish_reason", "prompt_tokens", "completion_tokens"}`, or
  `{"index", "prompt", "error"}`.

The output holds one line per input row, in input order, appended and flushed as rows finish in
order: an interrupted run leaves a valid prefix (a torn last line is dropped), and a rerun with
the same input and output skips the rows already there.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ServerConfig
from .local import LocalServer

URLS = ("/v1/chat/completions", "/v1/completions")
RETRY_STATUSES = (429, 503)  # the server is busy or still loading: sent again after a pause


@dataclass(frozen=True)
class BatchRow:
    index: int
    key: str  # what identifies the row in the output: its custom_id, or the prompt
    url: str
    body: dict[str, Any]
    openai: bool  # in the Batch API form (else a plain-text prompt)


def read_rows(path: str | Path, chat: bool = False,
              request: dict[str, Any] | None = None) -> list[BatchRow]:
    """The rows of a batch input file. Plain-text prompts become /v1/completions requests
    (/v1/chat/completions with `chat`: one user message each) with the fields of `request`
    (max_tokens, temperature, ...)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"batch input {str(path)!r} does not exist")
    lines = path.read_text(encoding="utf-8").splitlines()
    first = next((line for line in lines if line.strip()), None)
    if first is None:
        raise ValueError(f"{path}: no requests (the file is empty)")
    if first.lstrip().startswith("{"):
        return _openai_rows(path, lines)
    url = URLS[0] if chat else URLS[1]
    prompts = [line for line in lines if line.strip()]
    return [BatchRow(i, p, url, {**(request or {}),
                                 **({"messages": [{"role": "user", "content": p}]} if chat
                                    else {"prompt": p})}, openai=False)
            for i, p in enumerate(prompts)]


def _openai_rows(path: Path, lines: list[str]) -> list[BatchRow]:
    rows: list[BatchRow] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not a JSON object ({e.msg}); a Batch API input has one "
                             "request object per line") from None
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(item).__name__}")
        unknown = set(item) - {"custom_id", "method", "url", "body"}
        if unknown:
            raise ValueError(f"{where}: unknown fields {sorted(unknown)}; a request has "
                             "custom_id, method, url and body")
        custom_id, url, body = item.get("custom_id"), item.get("url"), item.get("body")
        if not isinstance(custom_id, str) or not custom_id:
            raise ValueError(f"{where}: custom_id must be a non-empty string")
        if custom_id in seen:
            raise ValueError(f"{where}: custom_id {custom_id!r} is used twice; each request "
                             "needs its own")
        if item.get("method", "POST") != "POST":
            raise ValueError(f"{where}: method must be POST, got {item.get('method')!r}")
        if url not in URLS:
            raise ValueError(f"{where}: url {url!r} is not supported; use one of "
                             f"{', '.join(URLS)}")
        if not isinstance(body, dict):
            raise ValueError(f"{where}: body must be a JSON object (the request's parameters)")
        if body.get("stream"):
            raise ValueError(f"{where}: stream is not supported in a batch")
        seen.add(custom_id)
        rows.append(BatchRow(len(rows), custom_id, url, body, openai=True))
    return rows


# ---- running rows ---------------------------------------------------------------------------
async def run_row(server: LocalServer, row: BatchRow, model: str) -> dict[str, Any]:
    """One row through the server's route -> its output record."""
    body = {"model": model, **row.body}
    delay = 0.05
    while (reply := await server.request("POST", row.url, body)).status in RETRY_STATUSES:
        await asyncio.sleep(delay)
        delay = min(2 * delay, 2.0)
    data = reply.json()
    error = data.get("error") if reply.status != 200 else None
    if row.openai:
        return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": row.key,
                "response": {"status_code": reply.status,
                             "request_id": f"req_{uuid.uuid4().hex}", "body": data},
                "error": error}
    if error is not None:
        return {"index": row.index, "prompt": row.key, "error": error["message"]}
    choice, usage = data["choices"][0], data["usage"]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    return {"index": row.index, "prompt": row.key, "text": text,
            "finish_reason": choice["finish_reason"],
            "prompt_tokens": usage["prompt_tokens"],
            "completion_tokens": usage["completion_tokens"]}


async def run_rows(server: LocalServer, rows: Iterable[BatchRow], model: str,
                   window: int) -> AsyncIterator[dict[str, Any]]:
    """Records in row order; up to `window` rows in the server at once (more than its batch
    slots, so the scheduler always has the next rows queued while the first are written)."""
    pending: collections.deque[asyncio.Task[dict[str, Any]]] = collections.deque()
    try:
        for row in rows:
            pending.append(asyncio.create_task(run_row(server, row, model)))
            while len(pending) >= window or (pending and pending[0].done()):
                yield await pending.popleft()
        while pending:
            yield await pending.popleft()
    finally:
        for task in pending:
            task.cancel()


def run_local(server_config: ServerConfig, model: str,
              rows: list[BatchRow]) -> Iterator[dict[str, Any]]:
    """Records of `rows` run in this process: one engine, continuous batching across rows."""
    loop = asyncio.new_event_loop()
    server = LocalServer(server_config)
    records = run_rows(server, rows, model, 4 * server_config.max_concurrent_requests)
    try:
        loop.run_until_complete(server.start())
        while True:
            try:
                yield loop.run_until_complete(anext(records))
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(records.aclose())  # type: ignore[attr-defined]
        server.stop()
        loop.close()


# ---- the output file ------------------------------------------------------------------------
def finished_rows(path: str | Path, rows: list[BatchRow]) -> int:
    """How many rows `path` already holds (0 if it does not exist), after dropping a torn last
    line; refuses an output that belongs to another input."""
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]  # a line without its newline was cut short
    lines = complete.decode("utf-8").splitlines()
    if len(lines) > len(rows):
        raise ValueError(f"{path} has {len(lines)} results but the input has {len(rows)} rows: "
                         "it belongs to another input; delete it or choose another output")
    for number, (line, row) in enumerate(zip(lines, rows, strict=False), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"{path}, line {number}: not a batch result (invalid JSON); delete "
                             "the file or choose another output") from None
        key = record.get("custom_id") if row.openai else record.get("prompt")
        if key != row.key:
            raise ValueError(f"{path}, line {number} is the result of {key!r}, but input row "
                             f"{number} is {row.key!r}: the output belongs to another input; "
                             "delete it or choose another output")
    if len(complete) != len(data):  # only now that the file is known to be this input's
        with open(path, "r+b") as f:
            f.truncate(len(complete))
    return len(lines)


@dataclass(frozen=True)
class BatchSummary:
    already_done: int  # rows found in the output from an earlier run
    ran: int  # rows run now
    failed: int  # of those, rows whose record is an error


def run_batch(rows: list[BatchRow], out: str | Path,
              runner: Callable[[list[BatchRow]], Iterable[dict[str, Any]]],
              progress: Any = None) -> BatchSummary:
    """Append the records of the rows not yet in `out`, in input order, each line flushed to
    disk as it is written. `runner(rows)` yields their records in order; `progress` (a tqdm
    bar) counts rows."""
    done = finished_rows(out, rows)
    if progress is not None:
        progress.update(done)
    ran = failed = 0
    if done == len(rows):
        return BatchSummary(done, ran, failed)
    f = None  # opened at the first record: a run that fails to start writes nothing
    try:
        for record in runner(rows[done:]):
            if f is None:
                Path(out).parent.mkdir(parents=True, exist_ok=True)
                f = open(out, "a", encoding="utf-8")  # noqa: SIM115 -- closed below
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
            ran += 1
            failed += record.get("error") is not None
            if progress is not None:
                progress.update()
    finally:
        if f is not None:
            f.close()
    return BatchSummary(done, ran, failed)
