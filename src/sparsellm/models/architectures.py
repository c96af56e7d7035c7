"""Which architectures sparsellm runs, keyed by HF `architectures` names and GGUF names.

Every architecture is a spec of the one decoder (decoder.py): an entry here names its config
mapping and its load-time tensor conversion (HF, and GGUF where llama.cpp defines it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import gemma3, gpt2, gpt_neox, gptj, llama, opt, phi, qwen3
from .decoder import ModelArgs

Tensors = dict[str, np.ndarray]


@dataclass(frozen=True)
class GGUFSpec:
    """How llama.cpp stores an architecture: metadata -> config.json keys, tensor names ->
    canonical (or fused intermediate) names, then layout transforms. `lazy`: convert works
    tensor by tensor on a LazyTensors (else it gets a dict, e.g. to split fused tensors)."""

    config: Callable[[str, Callable[..., Any]], dict[str, Any]]
    tensor_names: dict[str, str]
    convert: Callable[[Mapping[str, np.ndarray], ModelArgs, str], Mapping[str, np.ndarray]]
    lazy: bool = False


@dataclass(frozen=True)
class Architecture:
    name: str  # canonical family name
    description: str
    hf_names: tuple[str, ...]
    model_args: Callable[[dict[str, Any]], ModelArgs]  # config.json dict -> decoder spec
    from_hf: Callable[[Tensors, ModelArgs], Tensors]  # HF tensors -> canonical tensors
    gguf_names: tuple[str, ...] = ()
    gguf: GGUFSpec | None = None
    # The HF tensor names are the canonical ones (from_hf renames nothing), so stored tensors
    # are used as the files hold them and third-party compressed checkpoints are readable.
    canonical_hf_names: bool = False
    chat_template: str | None = None  # the family's chat format, for a GGUF that carries none

    def args(self, config: dict[str, Any]) -> ModelArgs:
        """model_args with a clear error for a config.json missing a required key."""
        try:
            return self.model_args(config)
        except KeyError as e:
            raise ValueError(f"config.json lacks {e.args[0]!r}, which the {self.name} "
                             "architecture needs") from None


ARCHITECTURES = [
    Architecture(
        "llama", "Llama 2, Llama 3.x (llama3 RoPE scaling), SmolLM, TinyLlama, Mistral, "
        "Qwen2, Qwen2.5",
        hf_names=("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"),
        model_args=llama.model_args, from_hf=llama.from_hf,
        gguf_names=("llama", "mistral", "qwen2"),
        gguf=GGUFSpec(llama.gguf_config, llama.GGUF_TENSOR_NAMES, llama.from_gguf,
                      lazy=True),
        canonical_hf_names=True,
    ),
    Architecture(
        "qwen3", "Qwen3 (dense; QK-norm)", ("Qwen3ForCausalLM",), qwen3.model_args,
        llama.from_hf, ("qwen3",),
        GGUFSpec(llama.gguf_config, qwen3.GGUF_TENSOR_NAMES, llama.from_gguf, lazy=True),
        canonical_hf_names=True,
    ),
    Architecture(
        "gemma3", "Gemma 3 (text; sliding-window and global layers, QK-norm, sandwich norms)",
        ("Gemma3ForCausalLM",), gemma3.model_args, gemma3.from_hf, ("gemma3",),
        GGUFSpec(gemma3.gguf_config, gemma3.GGUF_TENSOR_NAMES, llama.from_gguf, lazy=True),
        chat_template=gemma3.CHAT_TEMPLATE,
    ),
    Architecture("gpt2", "GPT-2, DistilGPT2", ("GPT2LMHeadModel",), gpt2.model_args,
                 gpt2.from_hf, ("gpt2",),
                 GGUFSpec(gpt2.gguf_config, gpt2.GGUF_TENSOR_NAMES, gpt2.from_gguf)),
    Architecture("opt", "OPT (pre-LayerNorm: 125m, 1.3b and up)", ("OPTForCausalLM",),
                 opt.model_args, opt.from_hf),
    Architecture("gptj", "GPT-J", ("GPTJForCausalLM",), gptj.model_args, gptj.gptj_from_hf),
    Architecture("codegen", "CodeGen (Salesforce/codegen-*)", ("CodeGenForCausalLM",),
                 gptj.codegen_args, gptj.codegen_from_hf),
    Architecture("gpt_neox", "GPT-NeoX, Pythia", ("GPTNeoXForCausalLM",), gpt_neox.model_args,
                 gpt_neox.from_hf, ("gptneox",),
                 GGUFSpec(gpt_neox.gguf_config, gpt_neox.GGUF_TENSOR_NAMES, gpt_neox.from_gguf)),
    Architecture("phi", "Phi-1.5, Phi-2", ("PhiForCausalLM",), phi.phi2_args, phi.phi2_from_hf,
                 ("phi2",),
                 GGUFSpec(phi.phi2_gguf_config, phi.PHI2_GGUF_TENSOR_NAMES, phi.phi2_from_gguf)),
    Architecture("phi3", "Phi-3 (mini 4k: default RoPE)", ("Phi3ForCausalLM",), phi.phi3_args,
                 phi.phi3_from_hf, ("phi3",),
                 GGUFSpec(phi.phi3_gguf_config, phi.PHI3_GGUF_TENSOR_NAMES, phi.phi3_from_gguf)),
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
        f"unsupported {kind} {name!r}; sparsellm supports: {', '.join(accepted)} "
        "(see `sparsellm models --architectures`)"
    )
