"""Random-weight checkpoints of real model shapes, for load, memory and speed measurements at
sizes no shipped model has: a Hugging Face folder (config.json, the default model's tokenizer,
bf16 safetensors sharded like the hub's, with an index) and optionally a GGUF file holding the
same bf16 values for llama.cpp. Weights are N(0, 0.02) drawn from a shared pool (fast; only
speed and memory are measured on them, never text); `sparsity` zeroes that share of every
decoder linear weight (the smallest magnitudes), as a pruned model has.

    python benchmarks/random_checkpoint.py tinyllama-1.1b scratch/tinyllama [--sparsity 0.5|2:4]
        [--gguf scratch/tinyllama.gguf]

Tensors are written one at a time (a 7B checkpoint never needs 7B in memory).
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sparsellm.dtypes import BFLOAT16

SHARD_BYTES = 4 << 30  # the hub's usual shard size for 7B models


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied: bool
    vocab: int = 49152  # the default model's tokenizer (SmolLM2)


SHAPES = {
    "smollm2-135m": Shape(576, 30, 9, 3, 1536, tied=True),
    "tinyllama-1.1b": Shape(2048, 22, 32, 4, 5632, tied=False),
    "llama-2-7b": Shape(4096, 32, 32, 32, 11008, tied=False),
}
_POOL = np.random.default_rng(0).standard_normal(1 << 24, dtype=np.float32) * np.float32(0.02)


def tensor_shapes(s: Shape) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every tensor, in the order the hub's files hold them."""
    kv = s.kv_heads * (s.hidden // s.heads)
    yield "model.embed_tokens.weight", (s.vocab, s.hidden)
    for i in range(s.layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (s.hidden,)
        yield p + "self_attn.q_proj.weight", (s.hidden, s.hidden)
        yield p + "self_attn.k_proj.weight", (kv, s.hidden)
        yield p + "self_attn.v_proj.weight", (kv, s.hidden)
        yield p + "self_attn.o_proj.weight", (s.hidden, s.hidden)
        yield p + "post_attention_layernorm.weight", (s.hidden,)
        yield p + "mlp.gate_proj.weight", (s.intermediate, s.hidden)
        yield p + "mlp.up_proj.weight", (s.intermediate, s.hidden)
        yield p + "mlp.down_proj.weight", (s.hidden, s.intermediate)
    yield "model.norm.weight", (s.hidden,)
    if not s.tied:
        yield "lm_head.weight", (s.vocab, s.hidden)


def random_values(name: str, shape: tuple[int, ...], index: int, sparsity: str) -> np.ndarray:
    """bf16 values of one tensor: ones for norms, a slice of the shared pool otherwise."""
    n = int(np.prod(shape))
    if len(shape) == 1:
        return np.ones(shape, BFLOAT16)
    start = (index * 7919 * 4099) % _POOL.size
    v = np.resize(np.roll(_POOL, -start), n).reshape(shape)
    if sparsity and name.startswith("model.layers."):
        v = prune(v, sparsity)
    return v.astype(BFLOAT16)


def prune(v: np.ndarray, sparsity: str) -> np.ndarray:
    """`v` with its smallest magnitudes zeroed: a share ("0.5"), or all but N of every M ("2:4")."""
    if ":" in sparsity:
        n, m = (int(k) for k in sparsity.split(":"))
        groups = v.reshape(-1, m).copy()
        np.put_along_axis(groups, np.argsort(np.abs(groups), axis=1)[:, : m - n], 0, axis=1)
        return groups.reshape(v.shape)
    return np.where(np.abs(v) < np.quantile(np.abs(_POOL[: 1 << 20]), float(sparsity)), 0, v)


def hf_folder(shape_name: str, out: Path, sparsity: str = "") -> Path:
    """`out`, written by write_hf_folder first if it holds no checkpoint yet."""
    if not (out / "config.json").is_file():
        print(f"writing {out}", file=sys.stderr, flush=True)
        write_hf_folder(shape_name, out, sparsity)
    return out


def write_hf_folder(shape_name: str, out: Path, sparsity: str = "") -> Path:
    """The HF folder (config, tokenizer, sharded bf16 safetensors + index) -> out."""
    from sparsellm.compression.save import write_tokenizer
    from sparsellm.models import DEFAULT_MODEL, load_checkpoint

    s = SHAPES[shape_name]
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(load_checkpoint(DEFAULT_MODEL), out)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": s.hidden, "num_hidden_layers": s.layers,
              "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
              "intermediate_size": s.intermediate, "vocab_size": s.vocab, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "max_position_embeddings": 4096,
              "tie_word_embeddings": s.tied, "hidden_act": "silu", "bos_token_id": 1,
              "eos_token_id": 2, "torch_dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    specs = list(tensor_shapes(s))
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shp in specs:
        nbytes = 2 * int(np.prod(shp))
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shp))
        size += nbytes
    files = ["model.safetensors"] if len(shards) == 1 else \
        [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    index, k = {}, 0
    for shard, file in zip(shards, files, strict=True):
        header, offset = {}, 0
        for name, shp in shard:
            nbytes = 2 * int(np.prod(shp))
            header[name] = {"dtype": "BF16", "shape": list(shp),
                            "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            index[name] = file
        blob = json.dumps(header).encode()
        blob += b" " * (-len(blob) % 8)
        with open(out / file, "wb") as f:
            f.write(struct.pack("<Q", len(blob)) + blob)
            for name, shp in shard:
                f.write(random_values(name, shp, k, sparsity).view(np.uint16).data)
                k += 1
    if len(files) > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    return out


def write_gguf(folder: Path, path: Path, ggml_type: str = "BF16") -> Path:
    """A llama.cpp GGUF with the folder's values and tokenizer, for the peers: F32 norms and
    matrices of `ggml_type` (BF16: the exact values; Q8_0, Q4_0: quantized by the gguf
    package's twin of llama.cpp's reference quantizer, one tensor at a time)."""
    import gguf

    from sparsellm.models import load_checkpoint

    ck = load_checkpoint(folder)
    a = ck.args
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(a.max_position_embeddings)
    w.add_embedding_length(a.hidden_size)
    w.add_block_count(a.num_hidden_layers)
    w.add_feed_forward_length(a.intermediate_size)
    w.add_head_count(a.num_attention_heads)
    w.add_head_count_kv(a.num_key_value_heads)
    w.add_layer_norm_rms_eps(a.norm_eps)
    w.add_rope_freq_base(a.rope_theta)
    w.add_vocab_size(a.vocab_size)
    qtype = gguf.GGMLQuantizationType[ggml_type]
    w.add_file_type(gguf.LlamaFileType["ALL_F32" if ggml_type == "F32" else f"MOSTLY_{ggml_type}"])
    tok = ck.tokenizer
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    vocab = tok._tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    w.add_token_list(tokens)
    merges = json.loads(tok._tok.to_str())["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}

    def gguf_name(name: str) -> str:
        if name in names:
            return names[name]
        i, rest = name[len("model.layers."):].split(".", 1)
        return f"blk.{i}.{layer[rest.rsplit('.', 1)[0]]}.weight"

    def data(name: str) -> np.ndarray:
        t = np.asarray(ck.stored[name], np.float32)
        return t if t.ndim == 1 else gguf.quants.quantize(t, qtype)

    stored = list(ck.stored)
    for name in stored:  # streamed: header first, then one tensor at a time
        t = ck.stored[name]
        if t.ndim == 1:
            w.add_tensor_info(gguf_name(name), t.shape, np.dtype(np.float32), t.size * 4)
        else:
            shape = gguf.quants.quant_shape_to_byte_shape(t.shape, qtype)
            w.add_tensor_info(gguf_name(name), shape, np.dtype(np.uint8),
                              int(np.prod(shape)), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name in stored:
        w.write_tensor_data(data(name))
    w.close()
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("out", type=Path)
    p.add_argument("--sparsity", default="", help='a share of zeros ("0.5") or N:M ("2:4")')
    p.add_argument("--gguf", type=Path, default=None, help="also write this GGUF file")
    args = p.parse_args()
    write_hf_folder(args.shape, args.out, args.sparsity)
    if args.gguf:
        write_gguf(args.out, args.gguf)
    print(f"wrote {args.out}" + (f" and {args.gguf}" if args.gguf else ""))


if __name__ == "__main__":
    main()
