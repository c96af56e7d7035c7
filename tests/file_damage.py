"""Damaging valid files for the readers' property tests (issue 55 item 2): Hypothesis strategies
that truncate a file, flip bits in it or set one of its fields to another value, and the check
every damaged file must pass: it loads (and then runs), or it is refused with the project's own
error naming the file; never another exception, a hang or a crash of the process.

The test modules: tests/models/test_damaged_gguf.py, test_damaged_safetensors.py,
test_damaged_compressed.py and tests/compression/test_damaged_recipes.py.
"""

from __future__ import annotations

import copy
import os
import re
import signal
import struct
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


def scaled(cases: int) -> int:
    """A test's number of cases, times $SPARSELLM_DAMAGE_SCALE (default 1: every format's tests
    add up to at least 500 cases, docs/testing.md; more for a longer search)."""
    return max(1, round(cases * float(os.environ.get("SPARSELLM_DAMAGE_SCALE", "1"))))


SETTINGS = settings(
    deadline=None,  # timings on a shared 2-core machine say nothing; hangs: time_limit
    derandomize=True,  # the same cases on every run: CI fails on a regression, not on luck
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
    print_blob=False,
)
CPU_SECONDS = 60.0  # one case loading and running a tiny model takes well under a second


class Hang(Exception):  # noqa: N818 - what it reports
    """A case still running after CPU_SECONDS of CPU time."""


@contextmanager
def time_limit(seconds: float = CPU_SECONDS) -> Iterator[None]:
    """Raise Hang in this thread once the process has used `seconds` of CPU time (not wall
    time: a process paused by a benchmark's guard does not time out)."""

    def expire(signum: int, frame: Any) -> None:
        raise Hang(f"still running after {seconds} s of CPU time")

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def is_own_error(e: BaseException) -> bool:
    """A ValueError the project raised: ValueError itself or a subclass defined in sparsellm
    (not json's JSONDecodeError, UnicodeDecodeError, pydantic's ValidationError, ...)."""
    return isinstance(e, ValueError) and (
        type(e) is ValueError or type(e).__module__.startswith("sparsellm."))


@dataclass
class Outcomes:
    """How the cases of one test ended: 'loaded' or 'refused', counted."""

    counts: Counter
    reasons: Counter  # refusals by their message, the file's path and numbers taken out

    def __init__(self) -> None:
        self.counts = Counter()
        self.reasons = Counter()

    @property
    def cases(self) -> int:
        return sum(self.counts.values())

    def check(self, run: Callable[[], object], path: Path | str | Sequence[Path],
              locator: str | None = None) -> str:
        """Run one case: 'loaded' when `run` returns, 'refused' when it raises the project's
        own ValueError whose message names `path` (or one of several paths) and matches the
        regex `locator` (where in the file); anything else fails the test with the error as
        its cause."""
        paths = [str(p) for p in ([path] if isinstance(path, Path | str) else path)]
        try:
            with time_limit():
                run()
            result = "loaded"
        except ValueError as e:
            message = str(e)
            named = [p for p in paths if message.startswith(p + ": ") or f" {p}" in message]
            if not (is_own_error(e) and named and
                    (locator is None or re.search(locator, message))):
                raise AssertionError(f"not the project's own error naming {' or '.join(paths)}"
                                     f"{' and ' + locator if locator else ''}: "
                                     f"{type(e).__module__}.{type(e).__name__}: {message}") from e
            result = "refused"
            self.reasons[re.sub(r"\d+", "N", message.replace(named[0], "<file>"))[:90]] += 1
        self.counts[result] += 1
        return result


    def summary(self, what: str) -> str:
        """How many cases, how they ended, and the commonest refusals (shown with -s)."""
        top = "\n  ".join(f"{n:5d} {reason}" for reason, n in self.reasons.most_common(12))
        return f"{self.cases} {what}: {dict(self.counts)}\n  {top}"


def replace_file(path: Path, data: bytes) -> None:
    """Write `data` as `path`, a new file (a map of the one it replaces stays valid)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# ---- damage ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Truncate:
    size: int

    def apply(self, data: bytes) -> bytes:
        return data[:self.size]


@dataclass(frozen=True)
class FlipBits:
    bits: tuple[tuple[int, int], ...]  # (byte offset, bit)

    def apply(self, data: bytes) -> bytes:
        out = bytearray(data)
        for offset, bit in self.bits:
            out[offset] ^= 1 << bit
        return bytes(out)


@dataclass(frozen=True)
class SetField:
    """Write `value` over the field at `offset` (struct format `fmt`, little-endian)."""

    label: str
    offset: int
    fmt: str
    value: int | float

    def apply(self, data: bytes) -> bytes:
        out = bytearray(data)
        struct.pack_into(self.fmt, out, self.offset, self.value)
        return bytes(out)


def truncations(size: int) -> st.SearchStrategy[Truncate]:
    """Cut anywhere, more often near the start (where the headers are) and the end."""
    return st.one_of(st.integers(0, size - 1), st.integers(0, min(size - 1, 4096)),
                     st.integers(max(0, size - 4096), size - 1)).map(Truncate)


def bit_flips(size: int, hot: int) -> st.SearchStrategy[FlipBits]:
    """1 to 8 flipped bits, most in the first `hot` bytes (the header), some anywhere."""
    offset = st.one_of(st.integers(0, hot - 1), st.integers(0, hot - 1),
                       st.integers(0, size - 1))
    return st.lists(st.tuples(offset, st.integers(0, 7)), min_size=1, max_size=8,
                    unique=True).map(lambda b: FlipBits(tuple(b)))


_UNSIGNED = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}


def int_values(original: int, nbytes: int) -> st.SearchStrategy[int]:
    """Values for an unsigned integer field of `nbytes` bytes: small and boundary values, the
    original shifted, scaled and off by a little, and anything."""
    top = 1 << (8 * nbytes)
    special = [0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 63, 64, 255, 256, 4095, 4096, 65535, 65536,
               2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
    scaled = [original * 2, original // 2, original * 4, original + 32, original + 4096,
              original << 16, original << 32, original - 1, original + 1]
    return st.one_of(st.sampled_from(special), st.sampled_from(scaled),
                     st.integers(-64, 64).map(lambda d: original + d),
                     st.integers(0, top - 1)).map(lambda v: v % top)


def float_values() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from([0.0, -0.0, -1.0, 1e-30, 1e30, float("inf"),
                                      float("-inf"), float("nan")]),
                     st.floats(allow_nan=True, allow_infinity=True, width=32))


@dataclass(frozen=True)
class Field:
    """A fixed-size field of a binary file: where, its struct format, and what it is."""

    label: str
    offset: int
    fmt: str  # struct format, little-endian

    def values(self, data: bytes) -> st.SearchStrategy[SetField]:
        (original,) = struct.unpack_from(self.fmt, data, self.offset)
        size = struct.calcsize(self.fmt)
        if self.fmt[-1] in "fd":
            return float_values().map(lambda v: SetField(self.label, self.offset, self.fmt, v))
        fmt = _UNSIGNED[size]
        return int_values(int(original) % (1 << 8 * size), size).map(
            lambda v: SetField(self.label, self.offset, fmt, v))


def field_changes(fields: Sequence[Field], data: bytes) -> st.SearchStrategy[SetField]:
    """One field, chosen by kind first (its label up to the first ':'), set to another value."""
    kinds: dict[str, list[Field]] = {}
    for f in fields:
        kinds.setdefault(f.label.split(":")[0], []).append(f)
    return st.sampled_from(sorted(kinds)).flatmap(
        lambda k: st.sampled_from(kinds[k])).flatmap(lambda f: f.values(data))


# ---- structured documents (JSON, YAML) ------------------------------------------------------
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**63, 2**64), st.sampled_from(
        [0, 1, -1, 2, 3, 4, 7, 8, 16, 32, 128, 4096, 2**31, 2**63]),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
    st.sampled_from(["", "int", "float", "group", "channel", "tensor", "token", "dense",
                     "Linear", "Embedding", "re:(", "re:.*", "lm_head", "0:0", "2:4"]))
json_values = st.recursive(
    json_scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6)


def paths_in(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys and indices) to a node of a JSON-like document, the root excluded."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) \
        if isinstance(doc, list) else ()
    for key, value in items:
        out.append((*prefix, key))
        out += paths_in(value, (*prefix, key))
    return out


@dataclass(frozen=True)
class EditDocument:
    """Replace the node at `path` by `value`, or delete it (`value` is DELETE), or rename its
    key (`value` a RenameKey)."""

    path: tuple
    value: Any

    def apply(self, doc: Any) -> Any:
        doc = copy.deepcopy(doc)
        parent = doc
        for key in self.path[:-1]:
            parent = parent[key]
        key = self.path[-1]
        if self.value is DELETE:
            del parent[key]
        elif isinstance(self.value, RenameKey):  # in a list: the item becomes the name
            if isinstance(parent, dict):
                parent[self.value.name] = parent.pop(key)
            else:
                parent[key] = self.value.name
        else:
            parent[key] = self.value
        return doc


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


DELETE = _Delete()


@dataclass(frozen=True)
class RenameKey:
    name: str


def document_edits(doc: Any, values: st.SearchStrategy[Any] = json_values,
                   keys: st.SearchStrategy[Any] | None = None,
                   ) -> st.SearchStrategy[EditDocument]:
    """One node of `doc` replaced (by `values`), deleted or its key renamed (to `keys`)."""
    paths = paths_in(doc)
    keys = st.text(max_size=10) if keys is None else keys
    return st.tuples(st.sampled_from(paths), st.one_of(
        values, st.just(DELETE), keys.map(RenameKey))).map(lambda pv: EditDocument(*pv))


def load_and_run(path: Path) -> None:
    """Load a checkpoint (file or folder), read every tensor and exact integers, build the
    native engine and run a prompt through it: what each test does with a case that loads."""
    from sparsellm.engine import Engine
    from sparsellm.models import load_checkpoint

    ckpt = load_checkpoint(path)
    for name in ckpt.tensors:
        ckpt.tensors[name]
    for name in ckpt.quantized:
        ckpt.quantized[name]
    engine = Engine(ckpt, sequence_length=16, num_cores=1, weights_cache=False)
    seq = engine.add_sequence()
    engine.prefill(seq, [1, 2, 3, 4])
    engine.decode_step([seq], [5])
