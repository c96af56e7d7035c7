"""`sparsellm compress MODEL --recipe R --dataset D --output-dir O`: one-shot compression."""

from __future__ import annotations

import argparse
import sys

from ..weight_format import CT_DENSE, CT_SPARSITY_FORMATS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="registry name, GGUF file, HF folder or hf:org/name")
    p.add_argument("--recipe", required=True, help="recipe YAML file (or a YAML string)")
    p.add_argument("--dataset", required=True,
                   help="python-stdlib, humaneval, a .txt/.jsonl/.json file, or a cached HF "
                   "dataset name")
    p.add_argument("--output-dir", required=True, help="folder to write (must not exist)")
    p.add_argument("--num-calibration-samples", type=int, default=128)
    p.add_argument("--max-seq-length", type=int, default=512)
    p.add_argument("--text-column", action="append", default=None,
                   help="dataset column(s) holding the text (repeatable)")
    p.add_argument("--split", default=None, help="split of a Hugging Face dataset")
    p.add_argument("--seed", type=int, default=0, help="sample-order seed (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output dir")
    p.add_argument("--sparsity-format", choices=CT_SPARSITY_FORMATS, default=CT_DENSE,
                   help="how pruned weights are stored: dense (zeros in place; loads in "
                   "transformers, vLLM and current compressed-tensors; the default) or "
                   "sparse-bitmask (smaller; sparsellm and compressed-tensors <= 0.12)")


def main(args: argparse.Namespace) -> int:
    from ..compression import compress

    result = compress(
        model=args.model,
        dataset=args.dataset,
        recipe=args.recipe,
        output_dir=args.output_dir,
        num_calibration_samples=args.num_calibration_samples,
        max_seq_length=args.max_seq_length,
        text_column=args.text_column,
        split=args.split,
        overwrite=args.overwrite,
        seed=args.seed,
        progress=None,
        sparsity_format=args.sparsity_format,
    )
    if not sys.stderr.isatty():  # compress() already printed the table on a terminal
        print(result.summary())
    print(f"wrote {result.output_dir}")
    return 0
