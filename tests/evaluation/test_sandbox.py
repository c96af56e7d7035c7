"""The sandbox runner: a generated program that hangs, crashes, exits early or hogs memory is
classified, cleaned up, and never takes the evaluation down with it."""

from __future__ import annotations

import os
import time

import pytest

from sparsellm.evaluation import run_program, run_programs
from sparsellm.evaluation.humaneval import (
    Completion,
    check_problems,
    execute_completions,
    program_for,
)

CHECK = "def check(f):\n    assert f(2, 3) == 5\ncheck(add)\n"

PROGRAMS = {
    "pass": ("def add(a, b):\n    return a + b\n" + CHECK, "passed"),
    "wrong": ("def add(a, b):\n    return a - b\n" + CHECK, "failed"),
    "syntax": ("def add(a, b)\n    return a + b\n" + CHECK, "failed"),
    "loop": ("while True:\n    pass\n", "timeout"),
    "sleep": ("import time\ntime.sleep(60)\n", "timeout"),
    "os_exit": ("import os\nos._exit(1)\n", "crashed"),
    "exit_0_before_check": ("import sys\nsys.exit(0)\n" + CHECK, "failed"),
    "os_exit_0_before_check": ("import os\nos._exit(0)\n" + CHECK, "failed"),
    "recursion": ("def f(n):\n    return f(n + 1)\nf(0)\n", "failed"),  # RecursionError
    "memory": ("x = []\nwhile True:\n    x.append(bytes(256 * 1024 * 1024))\n", "failed"),
    "segfault": ("import ctypes\nctypes.string_at(0)\n", "crashed"),
    # The output files are size-limited: writing past the limit fails (EFBIG).
    "output_flood": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", "failed"),
}


def test_bad_programs_are_classified_and_contained() -> None:
    names = list(PROGRAMS)
    start = time.monotonic()
    results = run_programs([PROGRAMS[n][0] for n in names], timeout=3, workers=len(names))
    elapsed = time.monotonic() - start
    got = {n: r.status for n, r in zip(names, results, strict=True)}
    assert got == {n: PROGRAMS[n][1] for n in names}, [(n, r.detail) for n, r in
                                                        zip(names, results, strict=True)]
    assert elapsed < 30  # the hanging ones were killed at the timeout
    by_name = dict(zip(names, results, strict=True))
    assert "AssertionError" in by_name["wrong"].detail
    assert "RecursionError" in by_name["recursion"].detail
    assert "MemoryError" in by_name["memory"].detail
    assert by_name["segfault"].detail == "killed by SIGSEGV"
    assert "File too large" in by_name["output_flood"].detail
    assert "SyntaxError" in by_name["syntax"].detail
    assert by_name["exit_0_before_check"].detail == "exited before the tests finished"


def test_children_are_killed_with_the_program(tmp_path) -> None:
    marker = tmp_path / "pid"
    program = (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(marker)!r}, 'w').write(str(p.pid))\n"
        "while True:\n    pass\n"
    )
    result = run_program(program, timeout=1.5)
    assert result.status == "timeout"
    pid = int(marker.read_text())
    for _ in range(100):  # the grandchild is gone (or a zombie about to be reaped by init)
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("a child of the timed-out program survived")


def test_programs_run_in_an_empty_isolated_folder() -> None:
    program = ("import os, sys\nassert os.listdir('.') == ['program.py'] or "
               "set(os.listdir('.')) <= {'program.py', 'stdout', 'stderr'}, os.listdir('.')\n"
               "assert sys.flags.isolated == 1\n")
    assert run_program(program).status == "passed"


def test_humaneval_program_layout() -> None:
    problem = {"task_id": "t/0", "prompt": "def add(a, b):\n", "entry_point": "add",
               "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}
    check_problems([problem])
    program = program_for(problem, "    return a + b")
    assert program.endswith("check(add)\n") and program.startswith(problem["prompt"])
    completions = [Completion("t/0", "    return a + b", "stop", 5),
                   Completion("t/0", "    return a * b", "stop", 5)]
    results = execute_completions([problem, problem], completions, timeout=5)
    assert [r.status for r in results] == ["passed", "failed"]
    with pytest.raises(ValueError, match="lacks"):
        check_problems([{"task_id": "x", "prompt": "p"}])


def test_canonical_humaneval_solutions_pass() -> None:
    """Our program layout + runner agree with the benchmark: canonical solutions pass."""
    from sparsellm.datasets import load_records

    problems = load_records("openai_humaneval", limit=8)
    completions = [Completion(p["task_id"], p["canonical_solution"], "stop", 0) for p in problems]
    results = execute_completions(problems, completions, timeout=10)
    assert [r.status for r in results] == ["passed"] * len(problems), [r.detail for r in results]
