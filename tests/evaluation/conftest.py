"""A tiny random Llama model (transformers) with a tiny BPE tokenizer, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "The quick brown fox jumps over the lazy dog.\n",
    "import os\nimport sys\nprint(os.getcwd(), sys.argv)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n",
] * 20


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = tmp_path_factory.mktemp("tiny-llama")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.save_pretrained(folder)
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, initializer_range=0.3, eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return folder
