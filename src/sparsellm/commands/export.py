"""`sparsellm export MODEL --target-path DIR`: a self-contained deployment folder."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="compressed or HF folder, GGUF file, registry name or "
                   "hf:org/name")
    p.add_argument("--task", default="text-generation")
    p.add_argument("--sequence-length", type=int, default=None,
                   help="tokens per sequence the deployment runs with (default 1024, or the "
                   "model's max_position_embeddings if shorter)")
    p.add_argument("--target-path", default="./deployment",
                   help="the folder is written to TARGET_PATH/deployment")
    p.add_argument("--overwrite", action="store_true", help="replace an existing deployment")


def main(args: argparse.Namespace) -> int:
    from ..export import export

    out = export(args.model, task=args.task, sequence_length=args.sequence_length,
                 target_path=args.target_path, overwrite=args.overwrite)
    print(f"wrote {out}")
    return 0
