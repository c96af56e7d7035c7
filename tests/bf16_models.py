"""Random Llama checkpoints stored in bf16, as the hub ships 1B-7B models (for loading and
compression tests that need a bf16 source)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from sparsellm.dtypes import BFLOAT16
from sparsellm.models.safetensors_io import write_safetensors


def write_bf16_model(folder: Path, tokenizer_dir: Path, hidden: int = 256, layers: int = 4,
                     intermediate: int = 768, vocab: int | None = None,
                     shards: int = 1, seed: int = 0) -> Path:
    """A random Llama checkpoint stored in bf16 (`shards` files + an index when > 1)."""
    vocab = vocab or json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"]
    vocab = len(vocab) if isinstance(vocab, dict) else vocab
    folder.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, folder / f.name)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": intermediate, "vocab_size": vocab, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 512, "tie_word_embeddings": False, "bos_token_id": 0,
        "eos_token_id": 2, "torch_dtype": "bfloat16"}))
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        kv = hidden // 2
        shapes |= {p + "input_layernorm.weight": (hidden,),
                   p + "post_attention_layernorm.weight": (hidden,),
                   p + "self_attn.q_proj.weight": (hidden, hidden),
                   p + "self_attn.k_proj.weight": (kv, hidden),
                   p + "self_attn.v_proj.weight": (kv, hidden),
                   p + "self_attn.o_proj.weight": (hidden, hidden),
                   p + "mlp.gate_proj.weight": (intermediate, hidden),
                   p + "mlp.up_proj.weight": (intermediate, hidden),
                   p + "mlp.down_proj.weight": (hidden, intermediate)}
    tensors = {n: (1 + 0.1 * rng.standard_normal(s) if len(s) == 1 else
                   rng.standard_normal(s) / np.sqrt(s[1])).astype(BFLOAT16)
               for n, s in shapes.items()}
    names = list(tensors)
    parts = [names[i::shards] for i in range(shards)]
    files = ["model.safetensors"] if shards == 1 else \
        [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    for part, file in zip(parts, files, strict=True):
        write_safetensors(folder / file, {n: tensors[n] for n in part})
    if shards > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {n: f for part, f in zip(parts, files, strict=True) for n in part}}))
    return folder
