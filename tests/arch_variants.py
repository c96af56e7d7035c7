"""Tiny-model variants (tests/conftest.py TINY_VARIANTS) of the non-Llama architectures, for
parametrizing tests in any folder."""

ARCH_VARIANTS = ["codegen", "gpt2", "gptj", "gpt_neox", "gpt_neox_sequential", "opt", "phi2",
                 "phi3", "qwen3", "gemma3"]
