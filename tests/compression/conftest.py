"""Tiny random Llama models (built with transformers, never downloaded) for compression tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seed_recipe import SEED_RECIPE

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "for i in range(10):\n    print(i * i)\n",
    "import os\nimport sys\n\nprint(os.getcwd(), sys.argv)\n",
    "The quick brown fox jumps over the lazy dog.\n",
    "while True:\n    break\n",
] * 20




@pytest.fixture(scope="session")
def seed_recipe() -> str:
    """The SparseML one-shot recipe of the seed guide, verbatim."""
    return SEED_RECIPE


def build_tiny_model(folder: Path, tie: bool = False, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>",
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                         "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}",
    }))
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, tie_word_embeddings=tie, eos_token_id=0, bos_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger-than-init weights so pruning visibly matters
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_tied_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_tied") / "model", tie=True)


@pytest.fixture(scope="session")
def calib_texts() -> list[str]:
    return CORPUS


@pytest.fixture(scope="session")
def greedy_tokens():
    """greedy_tokens(engine, ids, n): n greedy tokens straight from an Engine (EOS ignored),
    what a pipeline over the same checkpoint must generate."""
    import numpy as np

    def run(engine, ids: list[int], n: int) -> list[int]:
        seq = engine.add_sequence()
        out = [int(np.argmax(engine.prefill(seq, ids)[-1]))]
        while len(out) < n:
            out.append(int(np.argmax(engine.decode_step([seq], [out[-1]])[0])))
        engine.release(seq)
        return out

    return run
