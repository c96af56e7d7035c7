"""Streaming text: IncrementalDetokenizer never splits a character; StopStrings holds back text
that could begin a stop string."""

from __future__ import annotations

import gguf
import pytest

from sparsellm.generation import IncrementalDetokenizer, StopStrings
from sparsellm.models.gguf_loader import read_gguf_metadata
from sparsellm.tokenizer import Tokenizer

TEXT = "Hi 日本語 😀👍🏽 naïve café 한국어 done"


def _tokenizers(tiny_tokenizer_dir, tiny_gguf):
    path, _ = tiny_gguf("F32")
    return [Tokenizer.from_files(tiny_tokenizer_dir),  # byte-level BPE: bytes as tokens
            Tokenizer.from_gguf_metadata(read_gguf_metadata(gguf.GGUFReader(str(path))))]


@pytest.mark.parametrize("which", [0, 1], ids=["byte_level_bpe", "spm_byte_fallback"])
def test_deltas_never_split_a_character(which, tiny_tokenizer_dir, tiny_gguf):
    tok = _tokenizers(tiny_tokenizer_dir, tiny_gguf)[which]
    prompt = tok.encode("Say:")
    ids = tok.encode(TEXT, add_special_tokens=False)
    pieces = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "the test text must need multi-token characters"
    detok = IncrementalDetokenizer(tok, prompt)
    assert (detok.pieces is not None) == (which == 0)  # byte-level: the token-bytes table
    deltas = [detok.add(i) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(prompt + ids, skip_special_tokens=True)[
        len(tok.decode(prompt, skip_special_tokens=True)):]
    assert "".join(deltas).endswith(TEXT.split(" ", 1)[1])


def test_incomplete_character_is_flushed_as_replacement(tiny_tokenizer_dir):
    tok = Tokenizer.from_files(tiny_tokenizer_dir)
    ids = tok.encode("😀", add_special_tokens=False)
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tok)
    assert [detok.add(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.flush() == "\ufffd"


def test_special_tokens_are_skipped(tiny_tokenizer_dir):
    tok = Tokenizer.from_files(tiny_tokenizer_dir)
    detok = IncrementalDetokenizer(tok)
    out = "".join(detok.add(i) for i in tok.encode("a<|im_end|>b")) + detok.flush()
    assert out == "ab"


@pytest.mark.parametrize("which", [0, 1], ids=["byte_level_bpe", "spm_byte_fallback"])
def test_ids_past_the_vocabulary_decode_to_nothing(which, tiny_tokenizer_dir, tiny_gguf):
    """A model's embedding may have more rows than its tokenizer has tokens (padding)."""
    tok = _tokenizers(tiny_tokenizer_dir, tiny_gguf)[which]
    prompt, ids = tok.encode("Say:"), tok.encode(" ok", add_special_tokens=False)

    def text(ids):
        detok = IncrementalDetokenizer(tok, prompt)
        return "".join(detok.add(i) for i in ids) + detok.flush()

    assert text([ids[0], tok.vocab_size + 3, *ids[1:]]) == text(ids) != ""


def test_stop_strings():
    stops = StopStrings(["###", "\nUser:"])
    assert stops.find("abc") == -1
    assert stops.find("ab###cd\nUser:") == 2
    assert stops.find("x\nUser: ###") == 1
    assert stops.safe_length("hello #") == 6  # "#" may begin "###"
    assert stops.safe_length("hello ##") == 6
    assert stops.safe_length("hello\nUse") == 5
    assert stops.safe_length("hello") == 5
    assert StopStrings([]).safe_length("abc#") == 4
