"""Gemma 3 270M Q4_K_M, the GGUF llama.cpp users download, against transformers and against
llama.cpp's own run of the same file (issue 26). llama.cpp's greedy tokens, logits and HumanEval
perplexity were recorded once by benchmarks/record_llamacpp.py into tests/fixtures/llamacpp/
(llama.cpp is not built in CI).

transformers dequantizes the file to fp32 and computes in fp32: our fp32 run equals it. llama.cpp
quantizes activations to 8 bits per block of 32 or 256 values for its quantized dot products and
keeps an fp16 KV cache, so its logits differ from transformers' on the same file (up to 2.1 on
these prompts); where its top two tokens are that close, a greedy text can go either way. So we
compare each step given llama.cpp's own tokens (teacher forcing): the same top token, the same
logits within llama.cpp's own distance from transformers, and the same perplexity."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sparsellm.engine import Engine
from sparsellm.models import load_checkpoint

FIXTURE = Path(__file__).parents[1] / "fixtures" / "llamacpp" / "gemma-3-270m-q4_k_m.json"


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def gemma(recorded):
    ck = load_checkpoint("gemma-3-270m")
    assert ck.path.stat().st_size == recorded["model"]["bytes"]
    return ck


def sequences(recorded) -> list[tuple[dict, list[int]]]:
    """Each prompt's run and its prompt + llama.cpp's greedy tokens."""
    return [(r, r["prompt_ids"] + r["generated_ids"]) for r in recorded["greedy"]["prompts"]]


def test_prompts_tokenize_as_llama_cpp_does(recorded, gemma):
    for run, _ in sequences(recorded):
        assert gemma.tokenizer.encode(run["prompt"]) == run["prompt_ids"], run["name"]


@pytest.mark.slow
def test_fp32_logits_match_transformers_on_the_real_file(recorded, gemma):
    """Our fp32 run (the file's exact values) equals transformers' GGUF loader over every
    position of the five prompts and their continuations (measured: 1.3e-4)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        gemma.path.parent, gguf_file=gemma.path.name, dtype=torch.float32,
        attn_implementation="eager").eval()
    engine = Engine(gemma, sequence_length=256, weights="fp32")
    for run, ids in sequences(recorded):
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0].numpy()
        seq = engine.add_sequence()
        ours = engine.prefill(seq, ids, all_logits=True)
        engine.release(seq)
        np.testing.assert_allclose(ours, ref, atol=1e-3, rtol=0, err_msg=run["name"])


@pytest.mark.slow
@pytest.mark.parametrize("dynamic_int8", [False, True])
def test_each_step_agrees_with_llama_cpp(recorded, gemma, dynamic_int8):
    """Our default weights (int8 per channel), given llama.cpp's tokens: the top token at >= 97%
    of the 240 steps (measured: 235, as for fp32 = transformers), every other step a near tie
    in llama.cpp's own logits, and the top-8 logits near llama.cpp's. With fp32 activations,
    within the distance transformers has from them (transformers: max 2.13, mean 0.20; ours:
    max 1.83, mean 0.32). The default prompt path quantizes activations per 32 columns on
    AVX-512, as llama.cpp's Q8_0 does: 237 steps agree, mean 0.39, and the largest of the 1920
    distances is 2.82 (the next 1.94)."""
    engine = Engine(gemma, sequence_length=256, dynamic_int8=dynamic_int8)
    errors, agree, steps = [], 0, 0
    for run, ids in sequences(recorded):
        seq = engine.add_sequence()
        logits = engine.prefill(seq, ids, all_logits=True)
        engine.release(seq)
        first = len(run["prompt_ids"]) - 1
        for step, token in enumerate(run["generated_ids"]):
            row = logits[first + step]
            errors.append(np.abs(row[run["top_ids"][step]] - run["top_logits"][step]))
            steps += 1
            if int(row.argmax()) == token:
                agree += 1
            else:
                assert run["margin"][step] < 0.5, (run["name"], step, run["margin"][step])
    errors = np.concatenate(errors)
    assert agree >= 0.97 * steps, (agree, steps)
    assert errors.max() < (3.0 if dynamic_int8 else 2.5), errors.max()
    assert errors.mean() < 0.5 and np.percentile(errors, 99.9) < 2.0, errors.mean()


@pytest.mark.slow
def test_humaneval_perplexity_within_one_percent_of_llama_cpp(recorded, gemma):
    """On the first 40 HumanEval problems (llama.cpp's per-problem NLL is in the fixture; the
    whole set measured: ours 4.1954, llama.cpp 4.1932, over the same 34588 tokens)."""
    from sparsellm.evaluation import evaluate

    ref = recorded["humaneval_perplexity"]
    n = 40
    tokens = sum(ref["per_sample_scored_tokens"][:n])
    ref_ppl = float(np.exp(sum(ref["per_sample_nll"][:n]) / tokens))
    result = evaluate(gemma, datasets="openai_humaneval", sequence_length=ref["sequence_length"],
                      stride=ref["stride"], batch_size=8, limit=n)
    assert result.tokens == tokens
    assert abs(result.perplexity / ref_ppl - 1) < 0.01, (result.perplexity, ref_ppl)
