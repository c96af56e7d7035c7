"""Pipeline / TextGeneration end to end against transformers: greedy tokens, logits, streaming,
streamers, stop strings, EOS, batching and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from sparsellm import ContextLengthError, Pipeline
from sparsellm.engine import Engine
from sparsellm.models import load_checkpoint

PROMPTS = ["def f(x):", "import os\nimport sys\n\nclass Reader", "x", "The quick brown fox"]


@pytest.fixture(scope="module")
def pipe(tiny_llama_dir):
    return Pipeline.create(task="text-generation", model_path=str(tiny_llama_dir),
                           sequence_length=48, batch_size=4, max_generated_tokens=16)


def hf_greedy(model, ids, n, force=False):
    """transformers' greedy continuation: up to n tokens, stopping after its EOS; or (force)
    exactly n tokens, EOS ignored."""
    extra = dict(eos_token_id=None, min_new_tokens=n, pad_token_id=0) if force else {}
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long), **extra)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("variant", ["llama", "mistral", "qwen2", "codegen", "gpt_neox", "phi3"])
def test_greedy_tokens_match_transformers_generate(variant, tiny_model_dir, hf_model):
    """Same tokens and the same length: a wrong EOS (early or missed stop) fails too."""
    folder = tiny_model_dir(variant)
    p = Pipeline.create(model_path=str(folder), sequence_length=64, max_generated_tokens=24)
    for prompt in PROMPTS[:2]:
        ids = p.tokenizer.encode(prompt)
        out = p(prompt).generations[0]
        want = hf_greedy(hf_model(folder), ids, 24)
        assert out.token_ids == want
        assert out.finished_reason == ("stop" if len(want) < 24 else "length")
        forced = p(prompt, force_max_tokens=True).generations[0]
        assert forced.token_ids == hf_greedy(hf_model(folder), ids, 24, force=True)
        assert len(forced.token_ids) == 24


def test_batch_equals_each_alone(pipe):
    together = pipe(PROMPTS, force_max_tokens=True)
    assert len({len(pipe.tokenizer.encode(p)) for p in PROMPTS}) == 4
    for prompt, gen in zip(PROMPTS, together.generations, strict=True):
        alone = pipe(prompt, force_max_tokens=True).generations[0]
        assert (gen.token_ids, gen.text) == (alone.token_ids, alone.text)
        assert gen.finished_reason == "length" and len(gen.token_ids) == 16


def test_return_logits_shape_and_values(pipe, tiny_llama_dir, hf_model, hf_logits_fn):
    out = pipe(PROMPTS[:2], return_logits=True, max_generated_tokens=6, force_max_tokens=True)
    lengths = [len(pipe.tokenizer.encode(p)) + 6 for p in PROMPTS[:2]]
    assert out.logits.shape == (2, max(lengths), pipe.engine.vocab_size)
    for i, prompt in enumerate(PROMPTS[:2]):
        ids = pipe.tokenizer.encode(prompt) + out.generations[i].token_ids
        ref = hf_logits_fn(hf_model(tiny_llama_dir), ids)
        rows = out.logits[i, max(lengths) - lengths[i]:]
        np.testing.assert_allclose(rows, ref, atol=1e-3, rtol=0)
        assert not out.logits[i, :max(lengths) - lengths[i]].any()  # left padding
        # each generated token is the argmax of the row before it (greedy)
        assert (rows[len(ids) - 7:-1].argmax(-1) == out.generations[i].token_ids).all()
    fixed = pipe(PROMPTS[2], return_logits=True, max_generated_tokens=3,
                 fixed_sequences_length=True)
    assert fixed.logits.shape == (1, 48, pipe.engine.vocab_size)


def test_streaming_concatenates_to_the_non_streamed_text(pipe):
    full = pipe(PROMPTS[1], max_generated_tokens=20)
    chunks = list(pipe(PROMPTS[1], max_generated_tokens=20, streaming=True))
    assert "".join(c.generations[0].text for c in chunks) == full.sequences[0]
    assert chunks[-1].generations[0].finished_reason == full.generations[0].finished_reason
    assert all(not c.generations[0].finished for c in chunks[:-1])


def test_streaming_consumer_stopping_early_frees_the_slot(pipe):
    stream = pipe(PROMPTS[0], max_generated_tokens=16, force_max_tokens=True, streaming=True)
    next(stream)
    stream.close()
    assert pipe.engine.cache.num_free == 4 and not pipe.generator.has_work


def test_text_streamer(pipe, tiny_hf_tokenizer, capsys):
    out = pipe(PROMPTS[0], max_generated_tokens=10,
               streamer=transformers.TextStreamer(tiny_hf_tokenizer, skip_special_tokens=True))
    printed = capsys.readouterr().out
    assert printed == PROMPTS[0] + out.sequences[0] + "\n"
    # our tokenizer works inside TextStreamer too (decode accepts what it passes)
    out2 = pipe(PROMPTS[0], max_generated_tokens=10,
                streamer=transformers.TextStreamer(pipe.tokenizer, skip_prompt=True,
                                                   skip_special_tokens=True))
    assert capsys.readouterr().out == out2.sequences[0] + "\n"


def test_stop_string(pipe):
    full = pipe(PROMPTS[3], max_generated_tokens=16, force_max_tokens=True).sequences[0]
    stop = full[5:8]
    assert stop.strip() and full.find(stop) >= 3
    out = pipe(PROMPTS[3], max_generated_tokens=16, stop=[stop])
    assert out.sequences[0] == full[:full.find(stop)]
    assert out.generations[0].finished_reason == "stop"
    chunks = list(pipe(PROMPTS[3], max_generated_tokens=16, stop=stop, streaming=True))
    assert "".join(c.generations[0].text for c in chunks) == out.sequences[0]


def test_eos_from_generation_config_and_force_max_tokens(tiny_llama_dir, pipe):
    ck = load_checkpoint(tiny_llama_dir)
    free = pipe(PROMPTS[0], max_generated_tokens=16, force_max_tokens=True).generations[0]
    eos = free.token_ids[4]
    first = free.token_ids.index(eos)
    ck.generation_config = {"eos_token_id": [eos]}
    p = Pipeline.create(model_path=ck, sequence_length=48, max_generated_tokens=16)
    out = p(PROMPTS[0]).generations[0]
    assert out.finished_reason == "stop" and out.token_ids == free.token_ids[:first + 1]
    forced = p(PROMPTS[0], force_max_tokens=True).generations[0]
    assert forced.finished_reason == "length" and forced.token_ids == free.token_ids


def test_capacity(pipe):
    n = len(pipe.tokenizer.encode(PROMPTS[1]))
    out = pipe(PROMPTS[1], max_generated_tokens=100, force_max_tokens=True)
    assert out.generations[0].finished_reason == "capacity"
    assert len(out.generations[0].token_ids) == 48 - n


def test_seeded_sampling_is_reproducible(pipe):
    kw = dict(deterministic=False, sampling_temperature=1.5, top_p=0.95, max_generated_tokens=16,
              force_max_tokens=True)
    a = pipe(PROMPTS[0], seed=7, **kw).generations[0].token_ids
    assert pipe(PROMPTS[0], seed=7, **kw).generations[0].token_ids == a
    assert pipe(PROMPTS[0], seed=8, **kw).generations[0].token_ids != a
    assert pipe(PROMPTS[0], max_generated_tokens=16, force_max_tokens=True
                ).generations[0].token_ids != a  # greedy differs from hot sampling


def test_chat_messages_use_the_template(pipe, tiny_hf_tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    assert pipe.encode_prompt(messages) == list(tiny_hf_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def test_weights_converts_every_linear_on_load(tiny_llama_dir):
    pipe = Pipeline.create(model_path=str(tiny_llama_dir), weights="int8_a8", batch_size=1,
                           max_generated_tokens=8)
    assert set(pipe.engine.formats.values()) == {"int8_a8"}
    # it generates what an int8_a8 engine over the same checkpoint computes
    gen = pipe("def f(x):", force_max_tokens=True).generations[0]
    engine = Engine(load_checkpoint(tiny_llama_dir), sequence_length=64, weights="int8_a8")
    seq = engine.add_sequence()
    want = [int(np.argmax(engine.prefill(seq, pipe.tokenizer.encode("def f(x):"))[-1]))]
    while len(want) < 8:
        want.append(int(np.argmax(engine.decode_step([seq], [want[-1]])[0])))
    assert gen.token_ids == want
    with pytest.raises(ValueError, match="unknown weights format 'int9'.*int8_a8"):
        Pipeline.create(model_path=str(tiny_llama_dir), weights="int9")


def test_bad_input(pipe, tiny_llama_dir):
    with pytest.raises(ContextLengthError, match=r"the prompt has \d+ tokens but "
                                                 r"sequence_length is 48"):
        pipe("word " * 60)
    with pytest.raises(ValueError, match=r"invalid sampling_temperature=0.0: sampling needs a "
                                         r"finite temperature > 0"):
        pipe("x", deterministic=False, sampling_temperature=0.0)
    with pytest.raises(ValueError, match=r"invalid sampling_temperature=-0.5"):
        Pipeline.create(model_path=str(tiny_llama_dir), deterministic=False,
                        sampling_temperature=-0.5)
    with pytest.raises(ValueError, match=r"unknown generation setting\(s\) \['max_new_token'\]"):
        pipe("x", max_new_token=3)
    with pytest.raises(ValueError, match=r"unknown task 'summarization'"):
        Pipeline.create(task="summarization", model_path=str(tiny_llama_dir))
    with pytest.raises(ValueError, match="streaming=True takes a single prompt"):
        pipe(PROMPTS, streaming=True)
    with pytest.raises(ValueError, match="sequences must be a string or a non-empty list"):
        pipe([])
    assert pipe.engine.cache.num_free == 4 and not pipe.generator.has_work  # nothing leaked


# ---- SmolLM2-135M -------------------------------------------------------------------------------
SMOL_PROMPTS = [
    "def fibonacci(n):",
    "The capital of France is",
    "import numpy as np\n\ndef softmax(x):\n",
    "Once upon a time, in a small village,",
    "Translate to French: I like cheese.",
    "1, 2, 3, 5, 8, 13,",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "SELECT name FROM users WHERE",
    "Les chats sont",
    "# A list of emoji: 😀",
]


@pytest.mark.slow
def test_smollm2_greedy_64_tokens_match_transformers(smollm2_checkpoint, smollm2_hf_model):
    # fp32: the file's exact values, as transformers dequantizes them (by default the Q4_1
    # tensors run in int8 per channel)
    p = Pipeline.create(model_path=smollm2_checkpoint, sequence_length=160, batch_size=5,
                        max_generated_tokens=64, force_max_tokens=True, weights="fp32")
    out = p(SMOL_PROMPTS)
    for prompt, gen in zip(SMOL_PROMPTS, out.generations, strict=True):
        ids = p.tokenizer.encode(prompt)
        with torch.no_grad():
            ref = smollm2_hf_model.generate(
                torch.tensor([ids]), max_new_tokens=64, do_sample=False, min_new_tokens=64,
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                suppress_tokens=None, eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
        assert gen.token_ids == ref, prompt
