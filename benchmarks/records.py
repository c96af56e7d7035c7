"""Benchmark results as data: one JSON record per run under benchmarks/results/.

A record names what was run (benchmark, command, date, git commit) and where (machine(): the CPU
model, its ISA flags, the threads used and the read bandwidth measured at the start of the run),
and holds the run's rows (one dict per measured system and format, the benchmark's own fields).

    from records import machine, write_record
    where = machine(threads)
    write_record("peers", rows, argv=sys.argv, threads=threads, machine_info=where)

Tables and plots in docs/ are rendered from these files, never edited by hand.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().with_name("results")
# The ISA flags that decide which kernels run (csrc/runtime/cpu.cpp), as /proc/cpuinfo spells them.
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_vbmi2", "avx512_bf16")


def amd_core(family: int, model: int) -> str:
    """AMD's core generation from the CPU family and model (VMs often name only "AMD EPYC")."""
    if family == 0x17:
        return "Zen 2" if model >= 0x30 else "Zen 1"
    if family == 0x19:
        return "Zen 4" if 0x10 <= model <= 0x1F or 0x60 <= model <= 0xAF else "Zen 3"
    return "Zen 5" if family == 0x1A else ""


def cpu() -> tuple[str, list[str]]:
    """(model name, with AMD's core generation, the ISA_FLAGS this CPU has) from /proc/cpuinfo."""
    model, flags = platform.processor() or "unknown", set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, []
    field = {k.strip(): v.strip() for k, _, v in
             (line.partition(":") for line in text.split("\n\n")[0].splitlines())}
    model = field.get("model name", model)
    if field.get("vendor_id") == "AuthenticAMD" and (core := amd_core(
            int(field.get("cpu family", 0)), int(field.get("model", 0)))):
        model = f"{model} ({core})"
    flags = set(field.get("flags", "").split())
    return model, [f for f in ISA_FLAGS if f in flags]


def machine(threads: int | None = None) -> dict:
    """Where a run happens: CPU model, ISA flags, threads (default: every core), and the
    streaming read bandwidth (GB/s) of `threads` threads over 256 MB, measured now by the native
    extension (best of 3)."""
    from sparsellm.kernels import get_num_threads, set_num_threads
    from sparsellm.kernels._ext import native

    threads = threads or os.cpu_count() or 1
    model, isa = cpu()
    saved = get_num_threads()
    set_num_threads(threads)
    try:
        bandwidth = max(native().read_bandwidth(256 << 20) for _ in range(3))
    finally:
        set_num_threads(saved)
    return {"cpu": model, "isa": isa, "threads": threads, "cores": os.cpu_count(),
            "read_bandwidth_gb_s": round(bandwidth, 1), "kernel": platform.release()}


def git_commit() -> tuple[str, bool]:
    """(HEAD's commit, whether the work tree has uncommitted changes) of this checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                    cwd=root, capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False
    return head, dirty


# The checkout when the benchmark script started (it imports this module first thing): the code
# a run measures, even if commits land while it runs.
RUN_COMMIT = git_commit()


def write_record(benchmark: str, rows: list[dict], *, argv: list[str], threads: int,
                 machine_info: dict | None = None, extra: dict | None = None,
                 results: Path = RESULTS) -> Path:
    """Write one run's record atomically (temp file + rename) -> its path, named
    <UTC date>-<benchmark>-<cpu>-<commit>.json. The commit is the one the run started on."""
    now = datetime.datetime.now(datetime.UTC)
    commit, dirty = RUN_COMMIT
    where = machine_info or machine(threads)
    slug = re.sub(r"[^a-z0-9]+", "-", where["cpu"].lower()).strip("-")[:40]
    record = {"benchmark": benchmark, "date": now.isoformat(timespec="seconds"),
              "commit": commit, "dirty": dirty, "command": [Path(argv[0]).name, *argv[1:]],
              "machine": where, **(extra or {}), "rows": rows}
    if (end := git_commit()[0]) != commit:
        record["commit_at_end"] = end  # commits landed during the run
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{now:%Y-%m-%dT%H%M}-{benchmark}-{slug}-{commit[:8]}.json"
    fd, tmp = tempfile.mkstemp(dir=results, prefix=".record-", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path
