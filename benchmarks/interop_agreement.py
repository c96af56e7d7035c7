"""Does a compressed-tensors folder run the same here as in transformers + compressed-tensors?

    python benchmarks/interop_agreement.py ./smollm2-pruned50-quant [--tokens 64] [--texts 4]

Loads the folder in transformers (the CPU torch wheel; the test extras install it), reporting
every warning it logs, and in sparsellm; then feeds the same HumanEval texts (prompt +
canonical solution, first --tokens tokens each) through both and counts the positions where
the greedy next token agrees, in two modes:
  W8A8: each side as the checkpoint declares it (compressed-tensors fake-quantizes the
        activations per token; sparsellm runs its int8 kernels);
  W8:   activation quantization off on both sides (sparsellm `weights="fp32"`: the exact
        dequantized weights), which isolates the weights.
and, as the noise floor of W8A8, transformers against itself with its embeddings scaled by
(1 + 1e-6): dynamic per-token int8 activations turn float-rounding differences into different
codes (one step of a massive activation is large), so two correct W8A8 implementations that
sum in different orders agree only as well as that.
"""

from __future__ import annotations

import argparse
import logging
import warnings

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a compressed-tensors folder")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--texts", type=int, default=4, help="HumanEval problems (the first N)")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from sparsellm.datasets import load_texts
    from sparsellm.engine import Engine
    from sparsellm.models import load_checkpoint

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    hf_logging.enable_propagation()  # transformers' loggers do not reach the root otherwise
    logging.getLogger().addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    logging.getLogger().removeHandler(handler)
    hf_logging.disable_propagation()
    issues = [r.getMessage() for r in records] + [str(w.message) for w in caught]
    print(f"transformers load: {len(issues)} warnings")
    for text in issues[:10]:
        print("   ", text.splitlines()[0][:160])

    ckpt = load_checkpoint(args.model)
    ids_list = [ckpt.tokenizer.encode(t)[: args.tokens]
                for t in load_texts("humaneval")[: args.texts]]

    def hf_logits(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            return hf(torch.tensor([ids])).logits[0].float().numpy()

    def ours(engine: Engine, ids: list[int]) -> np.ndarray:
        seq = engine.add_sequence()
        out = engine.prefill(seq, ids, all_logits=True)
        engine.release(seq)
        return out

    scale = [1.0]
    hf.get_input_embeddings().register_forward_hook(lambda m, i, out: out * scale[0])
    base = [hf_logits(ids).argmax(-1) for ids in ids_list]
    scale[0] = 1 + 1e-6
    agree = sum(int((hf_logits(ids).argmax(-1) == b).sum())
                for ids, b in zip(ids_list, base, strict=True))
    scale[0] = 1.0
    total = sum(map(len, ids_list))
    print(f"noise floor: transformers W8A8 vs itself with embeddings x (1 + 1e-6): top-1 "
          f"agreement {agree}/{total} ({agree / total:.1%})")
    for mode, weights in (("W8A8", None), ("W8", "fp32")):
        if weights == "fp32":
            for module in hf.modules():
                module.quantization_enabled = False  # compressed-tensors' switch
        engine = Engine(ckpt, sequence_length=max(map(len, ids_list)) + 1, weights=weights,
                        weights_cache=False)
        agree = total = 0
        diff = []
        for ids in ids_list:
            a, b = ours(engine, ids), hf_logits(ids)
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            total += len(ids)
            diff.append(float(np.abs(a - b).max()))
        formats = sorted(set(engine.formats.values()))
        print(f"{mode:5} top-1 agreement {agree}/{total} ({agree / total:.1%}); max |logit "
              f"diff| {max(diff):.4f}; sparsellm formats {', '.join(formats)}")


if __name__ == "__main__":
    main()
