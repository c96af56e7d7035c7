"""Run untrusted generated Python programs in subprocesses with a timeout and resource limits.

Each program runs in `python -I` (isolated: no user site, no PYTHON* variables) in its own empty
temporary folder and its own process group, with limits on address space, CPU time, file size
and core dumps; output goes to files, never pipes, so a chatty program cannot block or bloat the
evaluator. A program passes only if it exits with status 0 *and* prints a random sentinel that is
appended after its tests, so `sys.exit(0)` / `os._exit(0)` before the tests is not a pass.

This stops accidents (infinite loops, crashes, memory hogs, stray child processes), not a
determined attacker: it is not a security boundary. Run evaluations of untrusted models in a
container.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

PASSED, FAILED, TIMEOUT, CRASHED = "passed", "failed", "timeout", "crashed"
DEFAULT_TIMEOUT = 5.0
DEFAULT_MEMORY_MB = 1024
MAX_OUTPUT_BYTES = 8 * 1024 * 1024
_POLL_SECONDS = 0.005
# The last line Python prints for an uncaught exception ("SyntaxError: ..." has no traceback).
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Iteration)\b")


@dataclass
class ExecutionResult:
    # "passed"; "failed": an uncaught Python exception (assertion, SyntaxError, MemoryError,
    # RecursionError, ...) or an exit before the tests finished; "timeout"; "crashed": killed by a
    # signal (segfault, ...) or a non-zero exit without a Python exception (os._exit(1))
    status: str
    returncode: int | None  # None when killed for the timeout; negative = killed by a signal
    seconds: float
    detail: str  # short reason: the exception line, the signal, ...


def _limits(memory_mb: int, cpu_seconds: int) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec: syscalls only
        import resource

        memory = memory_mb * 1024 * 1024
        for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_DATA, memory),
                             (resource.RLIMIT_CPU, cpu_seconds),
                             (resource.RLIMIT_FSIZE, MAX_OUTPUT_BYTES),
                             (resource.RLIMIT_CORE, 0)):
            with contextlib.suppress(ValueError, OSError):  # a platform without this limit
                resource.setrlimit(limit, (value, value))

    return apply


@dataclass(eq=False)
class _Running:
    index: int
    proc: subprocess.Popen
    folder: tempfile.TemporaryDirectory
    sentinel: str
    started: float
    deadline: float
    timed_out: bool = False


def run_programs(
    programs: Sequence[str],
    timeout: float = DEFAULT_TIMEOUT,
    workers: int | None = None,
    memory_mb: int = DEFAULT_MEMORY_MB,
    on_result: Callable[[int, ExecutionResult], None] | None = None,
) -> list[ExecutionResult]:
    """Run each program (Python source) in its own sandboxed subprocess, up to `workers` at
    once (default: the CPU count), each killed after `timeout` seconds of wall time."""
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    workers = max(1, workers or os.cpu_count() or 1)
    results: list[ExecutionResult | None] = [None] * len(programs)
    queue = list(range(len(programs)))[::-1]
    running: list[_Running] = []
    try:
        while queue or running:
            while queue and len(running) < workers:
                i = queue.pop()
                running.append(_start(i, programs[i], timeout, memory_mb))
            time.sleep(_POLL_SECONDS)
            now = time.monotonic()
            for run in list(running):
                if run.proc.poll() is None:
                    if now < run.deadline:
                        continue
                    run.timed_out = True
                    _kill_group(run.proc)
                    run.proc.wait()
                running.remove(run)
                results[run.index] = _finish(run)
                if on_result:
                    on_result(run.index, results[run.index])
    finally:
        for run in running:  # interrupted: leave nothing behind
            _kill_group(run.proc)
            run.proc.wait()
            run.folder.cleanup()
    return [r for r in results if r is not None]


def run_program(program: str, timeout: float = DEFAULT_TIMEOUT,
                memory_mb: int = DEFAULT_MEMORY_MB) -> ExecutionResult:
    return run_programs([program], timeout, 1, memory_mb)[0]


def _start(index: int, program: str, timeout: float, memory_mb: int) -> _Running:
    folder = tempfile.TemporaryDirectory(prefix="sparsellm-exec-")
    root = Path(folder.name)
    sentinel = f"__sparsellm_tests_finished_{uuid.uuid4().hex}__"
    (root / "program.py").write_text(f"{program}\n\nprint({sentinel!r}, flush=True)\n",
                                     encoding="utf-8")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root),
           "TMPDIR": str(root), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
    with open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-I", "program.py"], cwd=root, env=env, stdin=subprocess.DEVNULL,
            stdout=out, stderr=err, start_new_session=True,
            preexec_fn=_limits(memory_mb, int(timeout) + 1),
        )
    now = time.monotonic()
    return _Running(index, proc, folder, sentinel, now, now + timeout)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the program and anything it spawned


def _finish(run: _Running) -> ExecutionResult:
    seconds = time.monotonic() - run.started
    _kill_group(run.proc)  # stray children of a program that exited
    root = Path(run.folder.name)
    try:
        stdout = _tail(root / "stdout")
        stderr = _tail(root / "stderr")
    finally:
        run.folder.cleanup()
    code = run.proc.returncode
    if run.timed_out:
        return ExecutionResult(TIMEOUT, None, seconds, f"timed out after {seconds:.1f} s")
    if code == -signal.SIGXCPU:
        return ExecutionResult(TIMEOUT, code, seconds, "CPU time limit exceeded")
    if code == 0 and run.sentinel in stdout:
        return ExecutionResult(PASSED, 0, seconds, "")
    if code == 0:
        return ExecutionResult(FAILED, 0, seconds, "exited before the tests finished")
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        return ExecutionResult(CRASHED, code, seconds, f"killed by {name}")
    last = [line for line in stderr.strip().splitlines() if line.strip()]
    if code == 1 and last and _EXCEPTION_LINE.match(last[-1]):  # an uncaught Python exception
        return ExecutionResult(FAILED, code, seconds, last[-1][:200])
    return ExecutionResult(CRASHED, code, seconds, f"exited with status {code} and no traceback")


def _tail(path: Path, limit: int = 64 * 1024) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - limit))
        return f.read().decode("utf-8", errors="replace")
