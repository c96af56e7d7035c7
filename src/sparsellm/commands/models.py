"""`sparsellm models`: registry names (and whether each is installed), architectures."""

from __future__ import annotations

import argparse

from ..models import ARCHITECTURES, MODELS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--architectures", action="store_true", help="list supported architectures")


def main(args: argparse.Namespace) -> int:
    if args.architectures:
        print(f"{'family':<10} {'config.json architectures':<58} {'GGUF':<22} models")
        for a in ARCHITECTURES:
            print(f"{a.name:<10} {', '.join(a.hf_names):<58} "
                  f"{', '.join(a.gguf_names) or '-':<22} {a.description}")
        print("\nConfig variants an architecture does not implement are refused with an error "
              "naming the config.json key.")
        return 0
    print(f"{'name':<24} {'status':<10} description")
    for m in MODELS.values():
        path = m.locate() if m.installed else None
        status = "installed" if path else "missing"
        print(f"{m.name:<24} {status:<10} {m.description}")
        print(f"{'':<24} {'':<10} {path if path else 'install: ' + m.install_hint}")
    print("\nAny GGUF file, Hugging Face folder (config.json + *.safetensors) or hf:org/name from "
          "the local Hugging Face cache also works as MODEL.")
    return 0
