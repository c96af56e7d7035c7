"""Which architectures sparsellm runs, keyed by HF `architectures` names and GGUF names."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from . import llama


@dataclass(frozen=True)
class Architecture:
    name: str  # canonical family name
    module: ModuleType  # holds ModelArgs, the model class and the GGUF weight-name map
    hf_names: tuple[str, ...]
    gguf_names: tuple[str, ...]
    gguf_permuted_qk: tuple[str, ...] = ()  # GGUF archs whose Q/K rows llama.cpp permuted


ARCHITECTURES = [
    Architecture(
        "llama", llama,
        hf_names=("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"),
        gguf_names=("llama", "mistral", "qwen2"),
        gguf_permuted_qk=("llama", "mistral"),
    ),
]


def supported_names() -> list[str]:
    return sorted({n for a in ARCHITECTURES for n in a.hf_names})


def find_architecture(name: str, *, gguf: bool = False) -> Architecture:
    for arch in ARCHITECTURES:
        if name in (arch.gguf_names if gguf else arch.hf_names):
            return arch
    accepted = sorted({n for a in ARCHITECTURES for n in a.gguf_names}) if gguf else \
        supported_names()
    kind = "GGUF architecture" if gguf else "architecture"
    raise ValueError(
        f"unsupported {kind} {name!r}; sparsellm supports: {', '.join(accepted)}"
    )
