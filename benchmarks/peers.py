"""sparsellm beside its CPU peers on the same weights, one table per model shape.

    python benchmarks/peers.py --shape tinyllama-1.1b [--rounds 3] [--threads 2]
        [--pairs bf16 int8 int8_a8 int4_g32 sparse_int8_a8 q4_k_m]
        [--peers llamacpp ik_llama openvino openvino-f32] [--ik-dir /tmp/ik]
        [--openvino-python /tmp/ovenv/bin/python]
    python benchmarks/peers.py --shape smollm2-135m --pairs fp32 sparse_fp32 --peers deepsparse \
        --deepsparse-python /tmp/dsvenv/bin/python
    python benchmarks/peers.py --shape llama-2-7b --pairs int8_a8 int4_g32 --peers ik_llama \
        --ik-dir /tmp/ik --decode-only

Per format pair (ours vs llama.cpp's: bf16 vs BF16, int8 and int8_a8 vs Q8_0, int4_g32 and
int4_g32_a8 vs Q4_0 (which quantizes activations to int8 blocks, as int4_g32_a8 does per
token), 50%-sparse int8_a8 vs the dense Q8_0, which is what a llama.cpp user of the pruned
model runs (ik_llama.cpp: vs its Q4_0, the dense file of about the same bytes), fp32 and
sparse_fp32 vs F32, and q4_k_m: a Q4_K_M GGUF made by ik_llama.cpp's quantizer from the BF16
file, the same file in every system) and per OpenVINO GenAI weight format (its defaults on this
CPU: bf16 compute, u8 KV cache; openvino-f32: its strict fp32 mode), and DeepSparse 1.8 for fp32
and sparse_fp32 (fp32 on the dense folder and on the 50%-pruned one, whose zeros its sparse
kernels skip): decode tok/s (64 greedy tokens after an 8-token prompt, as llama-bench's tg64),
prefill tok/s of a 512-token prompt (pp512), time to first token of a 128-token prompt (best
of 2, after a warm-up prompt of that length, as a server that has answered before), and the
process's peak RSS. ik_llama.cpp runs as its users run it for speed: its llama-bench with
run-time repacking into row-interleaved layouts and flash attention (`-rtr 1 -fa 1`), best of 2
repetitions after its warm-up, pp128 (first token), pp512 and tg64 in one process. Every
figure comes from a fresh process; rounds alternate systems (ours, peer, ours, peer...) and the
table holds medians, so machine noise hits both sides alike. The table's heading names the
CPU, its ISA and its measured read bandwidth, and each run writes a record under
benchmarks/results/ (benchmarks/records.py).

Weights: random_checkpoint.py writes the HF folder (bf16) and its 50%-pruned twin once under
--scratch (a folder already there is used as it is), then GGUF files of the same values: BF16,
and Q8_0 / Q4_0 by the gguf package's twin of llama.cpp's reference quantizer. OpenVINO models
are exported from the same folder by optimum-intel; DeepSparse's from the pair's own folder by
deepsparse_export.py (SparseML 1.8's export with a KV cache, in DeepSparse's venv). Our
formats are converted once too, untimed, into the weights cache, so that every round loads a
converted model as the peers do.

Setup, once, outside CI (peers are never sparsellm dependencies):
    pip install llama-cpp-python gguf                  # compiles llama.cpp, ~15 min on 2 cores
    # ik_llama.cpp: fetch the public repository ikawrakow/ik_llama.cpp (a git dir), then
    shared/bench/build_ik_llama.sh GIT_DIR /tmp/ik    # ~7 min; --ik-dir /tmp/ik
    python -m venv ovenv && ovenv/bin/pip install torch==2.13.0 openvino-genai optimum-intel
    ovenv/bin/pip uninstall -y torchvision   # pulled in at a build that does not fit torch
                                             # 2.13.0 ("torchvision::nms does not exist")
    python -m venv dsvenv && dsvenv/bin/pip install torch==2.13.0 deepsparse==1.8.0 \
        sparseml==1.8.0 transformers==4.40.2 compressed-tensors==0.4.0 "datasets<2.19" \
        "accelerate<0.29" "pyarrow<17" "pandas<2.3" "setuptools<81"
    (DeepSparse's licence allows benchmarking only. SparseML 1.8's export wants transformers
    4.40 and pkg_resources; the other pins keep what accepts its numpy 1.x.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import render
from random_checkpoint import hf_folder, write_gguf
from records import machine, write_record

PROMPT, TTFT_PROMPT, DECODE, DECODE_PROMPT = 512, 128, 64, 8

# our format -> (checkpoint variant, llama.cpp type, ik_llama.cpp type, OpenVINO weight format)
PAIRS = {
    "bf16": ("dense", "BF16", "BF16", "fp16"),
    "int8": ("dense", "Q8_0", "Q8_0", "int8"),  # weight-only int8: `sparsellm generate`'s default
    "int8_a8": ("dense", "Q8_0", "Q8_0", "int8"),
    "int4_g32": ("dense", "Q4_0", "Q4_0", "int4"),
    "int4_g32_a8": ("dense", "Q4_0", "Q4_0", "int4"),
    "sparse_int8_a8": ("sparse50", "Q8_0", "Q4_0", None),
    # one GGUF file (ik_llama.cpp's quantizer, from the BF16 file) that every system runs as is
    "q4_k_m": ("dense", "Q4_K_M", "Q4_K_M", None),
    # DeepSparse's pairs: it computes in fp32, on the pair's own folder, and skips the pruned
    # one's zeros (llama.cpp runs the dense F32 file for both).
    "fp32": ("dense", "F32", None, None),
    "sparse_fp32": ("sparse50", "F32", None, None),
}
GGUF_PAIRS = {"q4_k_m"}  # ours runs the peers' GGUF file at its own width, not a folder
DEEPSPARSE = {"fp32", "sparse_fp32"}  # not in the default --pairs (the headline table's)
PEERS = ["llamacpp", "ik_llama", "openvino", "openvino-f32", "deepsparse"]

# Each child prints one JSON line: decode_tok_s, prefill_tok_s, ttft_s, peak_gb.
COMMON = f"PROMPT, TTFT_PROMPT, DECODE, DECODE_PROMPT = {PROMPT}, {TTFT_PROMPT}, {DECODE}, " \
    f"{DECODE_PROMPT}" + r"""
import json, sys, time
import numpy as np
kind, path, weights, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
DECODE_ONLY = sys.argv[5] == "1"  # --decode-only: no prompt timings (7B: each pp512 takes minutes)
rng = np.random.default_rng(0)
def prompt(n):
    return [int(t) for t in rng.integers(100, 40000, n)]
def peak_gb():  # this process's high-water RSS (getrusage's maxrss keeps the parent's at exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1e6
def report(runner):
    runner.first(prompt(DECODE_PROMPT if DECODE_ONLY else TTFT_PROMPT))  # warm up (pages
    ttft, prefill = [], []                                # mapped, threads started)
    for _ in range(0 if DECODE_ONLY else 2):
        ids = prompt(TTFT_PROMPT)
        t = time.perf_counter(); runner.first(ids); ttft.append(time.perf_counter() - t)
    for _ in range(0 if DECODE_ONLY else 2):
        ids = prompt(PROMPT)
        t = time.perf_counter(); runner.first(ids); prefill.append(time.perf_counter() - t)
    decode = []
    for _ in range(2):
        token = runner.first(prompt(DECODE_PROMPT))
        t = time.perf_counter()
        for _ in range(DECODE):
            token = runner.next(token)
        decode.append(time.perf_counter() - t)
    print(json.dumps({"decode_tok_s": DECODE / min(decode),
                      "prefill_tok_s": PROMPT / min(prefill) if prefill else None,
                      "ttft_s": min(ttft) if ttft else None, "peak_gb": peak_gb()}))
"""

CHILDREN = {
    "sparsellm": COMMON + r"""
from sparsellm.engine import Engine
engine = Engine(path, sequence_length=PROMPT + DECODE + 8, weights=weights or None,
                num_cores=threads)
class Runner:
    seq = None
    def first(self, ids):
        if self.seq is not None:
            engine.release(self.seq)
        self.seq = engine.add_sequence()
        return int(engine.prefill(self.seq, ids)[-1].argmax())
    def next(self, token):
        return int(engine.decode_step([self.seq], [token])[0].argmax())
report(Runner())
""",
    "llamacpp": COMMON + r"""
from llama_cpp import Llama
llm = Llama(model_path=path, n_ctx=PROMPT + DECODE + 8, n_batch=PROMPT, n_ubatch=PROMPT,
            n_threads=threads, n_threads_batch=threads, logits_all=False, verbose=False)
class Runner:
    def first(self, ids):
        llm.reset(); llm.eval(ids)
        return int(np.argmax(llm.scores[llm.n_tokens - 1]))
    def next(self, token):
        llm.eval([token])
        return int(np.argmax(llm.scores[llm.n_tokens - 1]))
report(Runner())
""",
    "openvino": COMMON + r"""
import openvino as ov, openvino_genai as ov_genai
config = {"INFERENCE_NUM_THREADS": threads}
if weights.endswith("f32"):                     # strict fp32: what our fp32 path computes
    config["INFERENCE_PRECISION_HINT"] = "f32"
pipe = ov_genai.LLMPipeline(path, "CPU", **config)
def generate(ids, n):                           # -> (first token s, s per later token)
    gen = ov_genai.GenerationConfig()
    gen.max_new_tokens = gen.min_new_tokens = n
    gen.do_sample = False
    metrics = pipe.generate(ov.Tensor(np.array([ids], np.int64)), gen).perf_metrics
    return metrics.get_ttft().mean / 1e3, metrics.get_tpot().mean / 1e3
generate(prompt(TTFT_PROMPT), 2)
ttft = min(generate(prompt(TTFT_PROMPT), 1)[0] for _ in range(2))
prefill = min(generate(prompt(PROMPT), 1)[0] for _ in range(2))
tpot = min(generate(prompt(DECODE_PROMPT), DECODE + 1)[1] for _ in range(2))
print(json.dumps({"decode_tok_s": 1 / tpot, "prefill_tok_s": PROMPT / prefill, "ttft_s": ttft,
                  "peak_gb": peak_gb()}))
""",
    # llama-bench: pp128 (first token), pp512 and tg64 in one process, best of its 2 repetitions
    # (after its warm-up run); the peak RSS is llama-bench's, this process's only child.
    "ik_llama": COMMON + r"""
import os, resource, subprocess
bench = os.path.join(sys.argv[6], "build", "bin", "llama-bench")
prompts = "0" if DECODE_ONLY else f"{TTFT_PROMPT},{PROMPT}"
proc = subprocess.Popen([bench, "-m", path, "-t", str(threads), "-rtr", "1", "-fa", "1", "-r", "2",
                         "-p", prompts, "-n", str(DECODE), "-o", "json"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
out, err = proc.communicate()
if proc.returncode:
    sys.exit(f"llama-bench failed: {err.strip().splitlines()[-1:]}")
best = {(t["n_prompt"], t["n_gen"]): max(t["samples_ts"]) for t in json.loads(out)}
print(json.dumps({"decode_tok_s": best[0, DECODE], "prefill_tok_s": best.get((PROMPT, 0)),
                  "ttft_s": TTFT_PROMPT / best[TTFT_PROMPT, 0] if not DECODE_ONLY else None,
                  "peak_gb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6}))
""",
    "deepsparse": COMMON + r"""
import os
os.environ["NM_DISABLE_ANALYTICS"] = "1"
from deepsparse import TextGeneration
# Its defaults otherwise: prompts run in chunks of 16 tokens (prompt_sequence_length), the KV
# cache lives in the engine, compiled for sequence_length positions that attention always spans.
# force_max_tokens: a random model's EOS must not end a run early.
pipe = TextGeneration(model_path=path, sequence_length=PROMPT + DECODE + 8, num_cores=threads,
                      force_max_tokens=True)
tok = pipe.tokenizer
candidates = sorted(w[1:] for w in tok.get_vocab() if w[0] == "\u0120" and w[1:].isalpha())
words = [w for w, ids in zip(candidates, tok([" " + w for w in candidates],
                                              add_special_tokens=False)["input_ids"])
         if len(ids) == 1]                       # " word" is one token, whatever stands before
specials = len(tok("")["input_ids"])
def text(n):                                     # random words: n tokens for the pipeline
    s = "".join(" " + w for w in rng.choice(words, n - specials))
    assert len(tok(s)["input_ids"]) == n
    return s
# Streamed and timed as a user sees it, text in and text out (its Python operators count). It
# yields max_new_tokens + 1 tokens: the prompt's, then max_new_tokens steps.
def generate(n_prompt, n_new):                   # -> (s to the first token, s per later token)
    s = text(n_prompt)
    t = time.perf_counter()
    stamps = [time.perf_counter() - t
              for _ in pipe(sequences=s, max_new_tokens=n_new, do_sample=False, streaming=True)]
    return stamps[0], (stamps[-1] - stamps[0]) / (len(stamps) - 1)
generate(TTFT_PROMPT, 2)
ttft = min(generate(TTFT_PROMPT, 1)[0] for _ in range(2))
prefill = min(generate(PROMPT, 1)[0] for _ in range(2))
tpot = min(generate(DECODE_PROMPT, DECODE)[1] for _ in range(2))
print(json.dumps({"decode_tok_s": 1 / tpot, "prefill_tok_s": PROMPT / prefill, "ttft_s": ttft,
                  "peak_gb": peak_gb()}))
""",
}


def measure(python: str, kind: str, path: Path, weights: str, threads: int, decode_only: bool,
            *extra: str) -> dict:
    out = subprocess.run([python, "-c", CHILDREN[kind], kind, str(path), weights, str(threads),
                          str(int(decode_only)), *extra], capture_output=True, text=True)
    if out.returncode:
        lines = out.stderr.strip().splitlines() or ["(no output)"]
        raise SystemExit(f"{kind} {weights} on {path} failed: {lines[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def prepare(shape: str, scratch: Path, pairs: list[str], peers: list[str], ov_python: str,
            ds_python: str, ik_dir: Path | None) -> dict:
    """Write what the runs need, once -> {(system, pair): (path, weights)}."""
    folders = {}
    needed = {PAIRS[p][0] for p in pairs} | ({"dense"} if peers else set())  # peers: dense
    for variant, sparsity in (("dense", ""), ("sparse50", "0.5")):
        if variant in needed:
            folders[variant] = hf_folder(shape, scratch / f"{shape}-{variant}", sparsity)
    runs = {}
    for pair in pairs:
        variant, llama_type, ik_type, ov_format = PAIRS[pair]
        if pair in GGUF_PAIRS:  # the peers' file, at its own width
            runs["sparsellm", pair] = (gguf_file(folders["dense"], llama_type, ik_dir), "")
        else:
            runs["sparsellm", pair] = (folders[variant], pair)
        convert(*runs["sparsellm", pair])
        if "llamacpp" in peers and llama_type:
            runs["llamacpp", pair] = (gguf_file(folders["dense"], llama_type, ik_dir), llama_type)
        if "ik_llama" in peers and ik_type:
            runs["ik_llama", pair] = (gguf_file(folders["dense"], ik_type, ik_dir), ik_type)
        for peer in ("openvino", "openvino-f32"):
            if peer in peers and ov_format:
                model = openvino_model(folders["dense"], ov_format, ov_python)
                runs[peer, pair] = (model, ov_format + ("-f32" if peer.endswith("f32") else ""))
        if "deepsparse" in peers and pair in DEEPSPARSE:
            runs["deepsparse", pair] = (deepsparse_model(folders[variant], ds_python),
                                        f"fp32 {variant}")
    return runs


def convert(path: Path, weights: str) -> None:
    """Load our model once, untimed, so its converted weights are in the weights cache, as the
    peers' GGUF and OpenVINO files are written once here: every round then loads a converted
    model, and peak RSS is a loaded model's, not a conversion's."""
    print(f"converting {path.name} to {weights or 'its own width'} (weights cache)",
          file=sys.stderr)
    subprocess.run([sys.executable, "-c", "import sys; from sparsellm.engine import Engine; "
                    "Engine(sys.argv[1], weights=sys.argv[2] or None, sequence_length=64)",
                    str(path), weights], check=True)


def gguf_file(folder: Path, llama_type: str, ik_dir: Path | None) -> Path:
    """The GGUF file of folder's values in llama_type, written once: BF16 / F32 / Q8_0 / Q4_0 by
    the gguf package (random_checkpoint.write_gguf), K-quants by ik_llama.cpp's llama-quantize
    from the BF16 file (the gguf package has no K-quant quantizer)."""
    out = folder.with_name(f"{folder.name}-{llama_type}.gguf")
    if out.exists():
        return out
    tmp = out.with_suffix(".tmp")
    if llama_type.startswith(("Q4_K", "Q5_K", "Q6_K")):
        if ik_dir is None:
            raise SystemExit(f"{llama_type} is written by ik_llama.cpp's llama-quantize: "
                             "pass --ik-dir")
        print(f"quantizing {out}", file=sys.stderr)
        subprocess.run([str(ik_dir / "build" / "bin" / "llama-quantize"),
                        str(gguf_file(folder, "BF16", ik_dir)), str(tmp), llama_type],
                       check=True, capture_output=True)
    else:
        print(f"writing {out}", file=sys.stderr)
        write_gguf(folder, tmp, llama_type)
    tmp.rename(out)
    return out


def openvino_model(folder: Path, fmt: str, python: str) -> Path:
    out = folder.with_name(f"{folder.name}-ov-{fmt}")
    if not (out / "openvino_model.xml").exists():
        print(f"exporting {out}", file=sys.stderr)
        extra = ["--group-size", "32", "--ratio", "1.0", "--sym"] if fmt == "int4" else []
        cli = str(Path(python).with_name("optimum-cli"))
        subprocess.run([cli, "export", "openvino", "--model", str(folder), "--task",
                        "text-generation-with-past", "--weight-format", fmt, *extra, str(out)],
                       check=True)
    return out


def deepsparse_model(folder: Path, python: str) -> Path:
    out = folder.with_name(f"{folder.name}-ds")
    if not (out / "model.onnx").exists():
        print(f"exporting {out}", file=sys.stderr)
        tmp = out.with_name(f"{out.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)  # what an interrupted export left
        tmp.mkdir()
        subprocess.run([python, str(Path(__file__).with_name("deepsparse_export.py")), str(folder),
                        str(tmp)], check=True, env={**os.environ, "NM_DISABLE_ANALYTICS": "1"})
        tmp.rename(out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="tinyllama-1.1b")
    p.add_argument("--scratch", type=Path, default=Path("scratch/peers"))
    p.add_argument("--pairs", nargs="+", choices=list(PAIRS),
                   help="default: every pair but DeepSparse's (and q4_k_m without --ik-dir)")
    p.add_argument("--peers", nargs="+", default=["llamacpp"], choices=PEERS)
    p.add_argument("--ik-dir", type=Path,
                   help="ik_llama.cpp built by shared/bench/build_ik_llama.sh (its WORK_DIR)")
    p.add_argument("--openvino-python", default=sys.executable,
                   help="the Python that has openvino-genai and optimum-intel (a venv of its own)")
    p.add_argument("--deepsparse-python", default=sys.executable,
                   help="the Python that has deepsparse and sparseml (a venv of its own)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--decode-only", action="store_true",
                   help="time decode alone (7B: a 512-token prompt takes minutes per run); "
                        "ours, llama-cpp-python and ik_llama.cpp")
    args = p.parse_args()
    if args.decode_only and {"openvino", "openvino-f32", "deepsparse"} & set(args.peers):
        p.error("--decode-only times ours, llamacpp and ik_llama")
    if "ik_llama" in args.peers and not (args.ik_dir and
                                         (args.ik_dir / "build/bin/llama-bench").exists()):
        p.error("--peers ik_llama needs --ik-dir DIR with DIR/build/bin/llama-bench "
                "(shared/bench/build_ik_llama.sh GIT_DIR DIR builds it)")
    if args.pairs is None:
        args.pairs = [pair for pair in PAIRS if pair not in DEEPSPARSE
                      and (args.ik_dir or pair not in GGUF_PAIRS)]
    args.scratch.mkdir(parents=True, exist_ok=True)
    runs = prepare(args.shape, args.scratch, args.pairs, args.peers, args.openvino_python,
                   args.deepsparse_python, args.ik_dir)
    where = machine(args.threads)
    results: dict[tuple[str, str], list[dict]] = {key: [] for key in runs}
    for r in range(args.rounds):
        for key, (path, weights) in runs.items():
            kind = "openvino" if key[0].startswith("openvino") else key[0]  # -f32: a setting
            python = {"openvino": args.openvino_python,
                      "deepsparse": args.deepsparse_python}.get(kind, sys.executable)
            extra = [str(args.ik_dir)] if kind == "ik_llama" else []
            results[key].append(measure(python, kind, path, weights, args.threads,
                                        args.decode_only, *extra))
            print(f"round {r + 1}: {key[0]} {weights}: {results[key][-1]}", file=sys.stderr)
    rows = [{"shape": args.shape, "pair": pair, "system": system, "weights": runs[system, pair][1],
             **{field: median(results[system, pair], field) for field in FIELDS},
             "rounds": results[system, pair]}
            for system, pair in runs]
    path = write_record("peers", rows, argv=sys.argv, threads=args.threads, machine_info=where,
                        extra={"rounds": args.rounds, "shape": args.shape,
                               "decode_only": args.decode_only})
    record = json.loads(path.read_text())  # the table docs/benchmarks.md renders from it
    print(f"\n{args.shape}, {render.where(record)}, medians of {args.rounds} interleaved rounds "
          "(fresh process each)\n")
    print("\n".join(render.peers_table(record)))
    print(f"\nrecord: {path}", file=sys.stderr)


FIELDS = ("decode_tok_s", "prefill_tok_s", "ttft_s", "peak_gb")


def median(rounds: list[dict], field: str) -> float | None:
    values = [r[field] for r in rounds if r.get(field) is not None]
    return statistics.median(values) if values else None


if __name__ == "__main__":
    main()
