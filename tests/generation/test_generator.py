"""BatchGenerator: finish reasons, stop strings, EOS, streaming events, batching.

A scripted engine (logits that force a chosen token sequence) makes the stopping rules exact;
the tiny real model checks batching and logits end to end.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparsellm.engine import ContextLengthError, Engine
from sparsellm.generation import BatchGenerator, GenerationConfig, GenerationRequest
from sparsellm.models import load_checkpoint
from sparsellm.tokenizer import Tokenizer


class _Cache:
    def __init__(self, n):
        self.free = n

    @property
    def num_free(self):
        return self.free


class ScriptedEngine:
    """Engine stand-in whose logits make greedy decoding emit `script`, token by token."""

    def __init__(self, script, vocab_size, sequence_length=64, max_sequences=4,
                 prompt_chunk=512):
        self.script, self.vocab_size, self.sequence_length = script, vocab_size, sequence_length
        self.prompt_chunk = prompt_chunk
        self.calls = []  # ("prefill", seq) / ("decode", seqs), in order
        self.cache = _Cache(max_sequences)
        self.lengths, self.fed = {}, {}
        self.next_slot = 0

    def add_sequence(self):
        self.cache.free -= 1
        self.next_slot += 1
        self.lengths[self.next_slot], self.fed[self.next_slot] = 0, 0
        return self.next_slot

    def release(self, seq):
        self.cache.free += 1

    def length(self, seq):
        return self.lengths[seq]

    def _row(self, seq):
        row = np.zeros(self.vocab_size, dtype=np.float32)
        row[self.script[min(self.fed[seq], len(self.script) - 1)]] = 10.0
        return row

    def prefill(self, seq, tokens, all_logits=False):
        self.calls.append(("prefill", seq))
        if self.lengths[seq]:  # feeding a generated token (the last one, for return_logits)
            self.fed[seq] += len(tokens)
        self.lengths[seq] += len(tokens)
        rows = np.stack([self._row(seq)] * (len(tokens) if all_logits else 1))
        return rows

    def decode_step(self, seqs, tokens):
        self.calls.append(("decode", tuple(seqs)))
        out = []
        for s, t in zip(seqs, tokens, strict=True):
            assert t == self.script[min(self.fed[s], len(self.script) - 1)]
            self.fed[s] += 1
            self.lengths[s] += 1
            out.append(self._row(s))
        return np.stack(out)


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    return Tokenizer.from_files(tiny_tokenizer_dir)


def run(tok, text_or_ids, eos=(), prompt="Q:", seq_len=64, **cfg):
    script = tok.encode(text_or_ids, False) if isinstance(text_or_ids, str) else text_or_ids
    gen = BatchGenerator(ScriptedEngine(script, len(tok), seq_len), tok, eos)
    events = []
    req = GenerationRequest(tok.encode(prompt), GenerationConfig(**cfg), on_event=events.append)
    gen.run([req])
    return req, events


def test_stop_string_is_excluded_and_never_streamed(tok):
    req, events = run(tok, "x = 1\n###\nmore text", stop=["###"], max_generated_tokens=50)
    assert req.finished_reason == "stop"
    assert req.text == "x = 1\n"
    streamed = "".join(e.text for e in events)
    assert streamed == req.text and "#" not in streamed
    assert [e.finished_reason for e in events][-1] == "stop"
    assert all(e.finished_reason is None for e in events[:-1])


def test_partial_stop_string_is_released_when_it_does_not_complete(tok):
    text = "a ## b # c #"
    req, events = run(tok, text, stop=["###"], max_generated_tokens=len(tok.encode(text, False)))
    assert req.finished_reason == "length"
    assert req.text == text  # the held-back trailing "#" is released at the end
    assert "".join(e.text for e in events) == req.text


def test_eos_finishes_with_stop_and_is_not_text(tok):
    eos = tok.token_to_id("<|im_end|>")
    script = tok.encode("hello there", False) + [eos] + tok.encode(" after", False)
    req, events = run(tok, script, eos=[eos], max_generated_tokens=50)
    assert req.finished_reason == "stop" and req.text == "hello there"
    assert req.output_ids[-1] == eos and len(req.output_ids) == script.index(eos) + 1
    forced, _ = run(tok, script, eos=[eos], max_generated_tokens=len(script),
                    force_max_tokens=True)
    assert forced.finished_reason == "length" and forced.output_ids == script
    assert forced.text == "hello there after"


def test_max_generated_tokens_gives_length(tok):
    req, _ = run(tok, "one two three four five six", max_generated_tokens=3)
    assert req.finished_reason == "length" and len(req.output_ids) == 3


def test_capacity(tok):
    prompt_len = len(tok.encode("Q:"))
    req, _ = run(tok, "one two three four five six seven", seq_len=prompt_len + 4,
                 max_generated_tokens=100)
    assert req.finished_reason == "capacity"
    assert len(req.prompt_ids) + len(req.output_ids) == prompt_len + 4


def test_streamed_text_never_splits_multibyte_characters(tok):
    eos = tok.token_to_id("<|im_end|>")
    script = tok.encode("emoji 😀 and 日本語!", False) + [eos]
    req, events = run(tok, script, eos=[eos], max_generated_tokens=100)
    assert all("\ufffd" not in e.text for e in events)
    assert "".join(e.text for e in events) == req.text == "emoji 😀 and 日本語!"
    assert any(e.text == "" for e in events)  # some tokens carried only part of a character


def test_prompt_too_long_or_empty(tok):
    gen = BatchGenerator(ScriptedEngine([5], len(tok), sequence_length=4), tok)
    with pytest.raises(ContextLengthError, match=r"the prompt has 4 tokens but sequence_length "
                                                 r"is 4: no room to generate"):
        gen.add(GenerationRequest([5, 6, 7, 8], GenerationConfig()))
    with pytest.raises(ValueError, match="the prompt is empty"):
        gen.add(GenerationRequest([], GenerationConfig()))


def test_cancel_frees_the_slot(tok):
    engine = ScriptedEngine(tok.encode("a b c d e f", False), len(tok), max_sequences=1)
    gen = BatchGenerator(engine, tok)
    a = gen.add(GenerationRequest(tok.encode("x"), GenerationConfig(max_generated_tokens=3)))
    b = gen.add(GenerationRequest(tok.encode("y"), GenerationConfig(max_generated_tokens=3)))
    gen.step()
    gen.cancel(a)
    assert a.finished_reason == "cancelled" and engine.cache.num_free == 1
    while gen.has_work:
        gen.step()
    assert b.finished_reason == "length"


def test_each_first_token_is_streamed_when_its_own_prompt_is_done(tok):
    """Requests admitted together: the first one's token reaches its stream before the second
    prompt's prefill runs, not after every admitted prompt."""
    engine = ScriptedEngine(tok.encode("a b c", False), len(tok))
    gen = BatchGenerator(engine, tok)
    for prompt in ("x", "y", "z"):
        gen.add(GenerationRequest(tok.encode(prompt), GenerationConfig(max_generated_tokens=2),
                                  on_event=lambda e: engine.calls.append(("event", e.request))))
    gen.step()
    kinds = [c[0] for c in engine.calls]
    assert kinds == ["prefill", "event"] * 3


def test_prompts_join_decoding_streams_one_chunk_of_tokens_per_step(tok):
    """While a stream decodes, a step feeds prompts up to prompt_chunk tokens (at least one),
    so the stream's next token waits about one chunk; with nothing decoding, all are admitted."""
    long = [tok.encode("one two three four five six seven eight nine ten")] * 3
    chunk = len(long[0]) * 3 // 2  # one prompt fits in a chunk, two do not
    engine = ScriptedEngine(tok.encode("a b c d e f g h", False), len(tok), sequence_length=512,
                            max_sequences=8, prompt_chunk=chunk)
    gen = BatchGenerator(engine, tok)
    cfg = GenerationConfig(max_generated_tokens=6)
    gen.add(GenerationRequest(tok.encode("first"), cfg))
    gen.step()  # nothing was decoding: admitted
    for ids in long:
        gen.add(GenerationRequest(ids, cfg))
    gen.step()  # one decode, then one prompt: a second would pass the chunk
    assert len(gen.waiting) == 2 and [c[0] for c in engine.calls[-2:]] == ["decode", "prefill"]
    gen.step()
    assert len(gen.waiting) == 1
    idle = ScriptedEngine(tok.encode("a b", False), len(tok), max_sequences=8,
                          prompt_chunk=chunk, sequence_length=512)
    burst = BatchGenerator(idle, tok)
    for ids in long:
        burst.add(GenerationRequest(ids, cfg))
    burst.step()
    assert not burst.waiting  # nothing decoding: every prompt that has a slot


# ---- the tiny real model ------------------------------------------------------------------------
def test_batch_of_prompts_equals_each_alone(tiny_model_dir):
    ck = load_checkpoint(tiny_model_dir("llama"))
    prompts = ["def f(x):", "import os\nimport sys\n\nclass A", "x", "The quick brown fox jumps"]
    ids = [ck.tokenizer.encode(p) for p in prompts]
    assert len({len(i) for i in ids}) == 4
    cfg = GenerationConfig(max_generated_tokens=12, force_max_tokens=True)
    batch = BatchGenerator(Engine(ck, sequence_length=40, max_sequences=4), ck.tokenizer)
    together = batch.run([GenerationRequest(i, cfg) for i in ids])
    for i, r in zip(ids, together, strict=True):
        alone = BatchGenerator(Engine(ck, sequence_length=40), ck.tokenizer)
        (single,) = alone.run([GenerationRequest(i, cfg)])
        assert r.output_ids == single.output_ids and r.text == single.text
    # more requests than slots: queued and admitted as slots free up, same results
    small = BatchGenerator(Engine(ck, sequence_length=40, max_sequences=2), ck.tokenizer)
    queued = small.run([GenerationRequest(i, cfg) for i in ids])
    assert [r.output_ids for r in queued] == [r.output_ids for r in together]


def test_a_long_prompt_is_fed_one_window_per_step_beside_decoding_streams(tiny_model_dir):
    """A prompt longer than prompt_chunk arriving while a stream decodes is fed one window a
    step (the stream gets a token every step), and gives exactly what it gives alone: the same
    tokens, and prompt logprobs from the same bits."""
    ck = load_checkpoint(tiny_model_dir("llama"))
    text = "import os\nimport sys\n\nclass A:\n    def f(self, x):\n        return x + 1\n"
    long_ids = ck.tokenizer.encode(text * 3)
    chunk = 16
    assert 3 * chunk < len(long_ids) < 120
    cfg = GenerationConfig(max_generated_tokens=8, force_max_tokens=True)

    def engine():
        return Engine(ck, sequence_length=128, max_sequences=2,
                      prompt_processing_sequence_length=chunk)

    gen = BatchGenerator(engine(), ck.tokenizer)
    stream = gen.add(GenerationRequest(ck.tokenizer.encode("def f(x):"),
                                       GenerationConfig(max_generated_tokens=32,
                                                        force_max_tokens=True)))
    gen.step()
    long = gen.add(GenerationRequest(long_ids, cfg, score_prompt=True, logprobs=2))
    windows = -(-len(long_ids) // chunk)
    for step in range(1, windows):
        events = gen.step()
        assert [e.request for e in events] == [stream]  # the stream's token, nothing of long's
        assert gen.active[long].fed == step * chunk and not long.output_ids
        assert gen.prefilling == 1
    events = gen.step()  # the last window: long's first token
    assert [e.request for e in events] == [stream, long] and gen.prefilling == 0
    while gen.has_work:
        gen.step()
    for r in (stream, long):
        alone = BatchGenerator(engine(), ck.tokenizer)
        (single,) = alone.run([GenerationRequest(r.prompt_ids, r.config,
                                                 score_prompt=r.score_prompt,
                                                 logprobs=r.logprobs)])
        assert r.output_ids == single.output_ids and r.text == single.text
        assert r.prompt_logprobs == single.prompt_logprobs  # bit for bit
    assert len(long.prompt_logprobs) == len(long_ids) - 1
