"""Truncated and corrupt model files are refused when loaded, with the file, what is wrong and
where (issue 29): an interrupted download must not surface as a NumPy reshape error."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest

from sparsellm.models import load_checkpoint

INTERRUPTED = r" \(an interrupted download or copy\?\)"


def refused(path: Path, message: str) -> str:
    """The pattern of the whole text of ValueError("<path>: <message>"), `message` a regex."""
    return f"^{re.escape(str(path))}: {message}$"


@pytest.fixture
def gguf_bytes(tiny_gguf) -> bytes:
    path, _ = tiny_gguf("F32")
    return path.read_bytes()


@pytest.fixture
def st_folder(tiny_llama_dir, tmp_path) -> Path:
    """A copy of the tiny HF folder, whose model.safetensors the test damages."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, folder)
    return folder


def test_truncated_gguf_names_the_tensor_and_the_offset(gguf_bytes, tmp_path):
    path = tmp_path / "tiny.gguf"
    size = len(gguf_bytes) - 1000
    path.write_bytes(gguf_bytes[:size])  # the last tensors' data is cut short
    pattern = refused(path, rf"truncated: tensor \S+ ends at byte \d+ but the file has {size} "
                      rf"bytes{INTERRUPTED}")
    with pytest.raises(ValueError, match=pattern):
        load_checkpoint(path)


def test_gguf_cut_inside_its_header(gguf_bytes, tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(gguf_bytes[:200])  # inside the metadata: the fifth key's name
    pattern = refused(path, r"truncated GGUF header: key/value 4 at byte 176 runs past the end "
                      r"of the file \(200 bytes; an interrupted download or copy\?\)")
    with pytest.raises(ValueError, match=pattern):
        load_checkpoint(path)


def test_gguf_with_a_wrong_magic(gguf_bytes, tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUX" + gguf_bytes[4:])
    pattern = refused(path, r"not a GGUF file \(it starts with b'GGUX', not b'GGUF'\)")
    with pytest.raises(ValueError, match=pattern):
        load_checkpoint(path)


def test_truncated_safetensors_names_the_tensor_and_the_offset(st_folder):
    path = st_folder / "model.safetensors"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-1000])
    pattern = refused(path, rf"truncated: tensor \S+ ends at byte \d+ but the file has "
                      rf"{size - 1000} bytes{INTERRUPTED}")
    with pytest.raises(ValueError, match=pattern):
        load_checkpoint(st_folder)


@pytest.mark.parametrize("cut", [0, 5, 50])
def test_safetensors_shorter_than_its_header(st_folder, cut):
    path = st_folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:cut])
    header = struct.unpack("<Q", data[:8])[0] if cut >= 8 else -1
    pattern = refused(path, rf"not a safetensors file \(header length {header} for a file of "
                      rf"{cut} bytes\)")
    with pytest.raises(ValueError, match=pattern):
        load_checkpoint(st_folder)


def test_safetensors_header_that_is_not_json(st_folder):
    path = st_folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:8] + b"x" + data[9:])  # the header's opening brace
    pattern = refused(path, r"corrupt safetensors header: Expecting value \(at byte 8\)")
    with pytest.raises(ValueError, match=pattern):
        load_checkpoint(st_folder)


# ---- found by the damaged-file property tests (test_damaged_*.py, issue 55 item 2) ----------
def _field(data: bytes, name: bytes, after: int, fmt: str, value: int) -> bytes:
    """`data` with the struct field `after` bytes past the end of the GGUF string `name` (a key
    or a tensor name) set to `value`."""
    out = bytearray(data)
    struct.pack_into(fmt, out, data.index(name) + len(name) + after, value)
    return bytes(out)


def test_gguf_tensor_smaller_than_the_config_is_refused_by_name(gguf_bytes, tmp_path):
    """A dimension cut (the data still inside the file) was loaded and reached the native model,
    whose ValueError ("k: expected shape (32, 64)") named neither the file nor the tensor."""
    path = tmp_path / "tiny.gguf"
    # blk.0.attn_k.weight: n_dims u32, dims [64, 32] (columns first): 16 rows instead of 32
    path.write_bytes(_field(gguf_bytes, b"blk.0.attn_k.weight", 4 + 8, "<Q", 16))
    with pytest.raises(ValueError, match=refused(path, r"tensor model.layers.0.self_attn.k_proj."
                                                       r"weight has shape \(16, 64\), but the "
                                                       r"model's config makes it \(32, 64\)")):
        load_checkpoint(path)


def test_gguf_tensor_data_offset_must_be_aligned(gguf_bytes, tmp_path):
    path = tmp_path / "tiny.gguf"
    # output_norm.weight: n_dims 1, one dim, its type, then its data offset
    data = bytearray(gguf_bytes)
    at = gguf_bytes.index(b"output_norm.weight") + len(b"output_norm.weight") + 4 + 8 + 4
    struct.pack_into("<Q", data, at, struct.unpack_from("<Q", data, at)[0] + 4)
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=refused(path, r"corrupt GGUF tensor table \(tensor "
                                                       r"output_norm.weight's data offset \d+ is "
                                                       r"not a multiple of the alignment, 32\)")):
        load_checkpoint(path)


@pytest.mark.parametrize("key, after, fmt, value, message", [
    # was ZeroDivisionError (hidden_size // heads)
    (b"llama.attention.head_count", 0, "<I", 6, r"GGUF key llama.attention.head_count is "
     r"5\.6\S+e-45; expected a positive integer"),  # type uint32 -> float32: 4's bits
    (b"llama.attention.head_count", 4, "<I", 0, r"GGUF key llama.attention.head_count is 0; "
     r"expected a positive integer"),
    # was TypeError: ModelArgs.__init__() missing 'num_hidden_layers'
    (b"llama.block_count", -1, "<B", ord("x"), r"GGUF key llama.block_count is missing; the "
     r"model's sizes need it"),
    # was a billion-layer name table built before anything was checked
    (b"llama.block_count", 4, "<I", 2**31, r"the config has 2147483648 layers, but the file "
     r"holds 21 tensors in all"),
    # was "unsupported GGUF architecture 'llamb'" without the file
    (b"general.architecture", 4 + 8 + 4, "<B", ord("b"), r"GGUF key general.architecture: "
     r"unsupported GGUF architecture 'llamb'; sparsellm supports: .*"),
    # was a TypeError in the tokenizer
    (b"tokenizer.ggml.model", 4 + 8, "<B", ord("X"), r"GGUF key tokenizer.ggml.model is 'Xlama'; "
     r"supported: gpt2, llama"),
])
def test_gguf_metadata_the_loader_cannot_use_is_refused_by_key(gguf_bytes, tmp_path, key, after,
                                                               fmt, value, message):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(_field(gguf_bytes, key, after, fmt, value))
    with pytest.raises(ValueError, match=refused(path, message)):
        load_checkpoint(path)


def test_gguf_special_token_id_past_the_vocabulary_names_no_token(gguf_bytes, tmp_path):
    """As llama.cpp: ignored (it was an IndexError building the tokenizer)."""
    path = tmp_path / "tiny.gguf"
    path.write_bytes(_field(gguf_bytes, b"tokenizer.ggml.unknown_token_id", 4, "<I", 2**31))
    assert load_checkpoint(path).tokenizer.unk_token is None


def _rewrite_header(path: Path, edit) -> None:
    data = path.read_bytes()
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + n])
    edit(header)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data[8 + n:])


@pytest.mark.parametrize("edit, message", [
    # each was a KeyError, TypeError, OverflowError, OSError or a NumPy reshape error
    (lambda h: h["lm_head.weight"].pop("dtype"), r"corrupt safetensors header: tensor "
     r"lm_head.weight is \{.*\}, not a mapping with dtype, shape and data_offsets"),
    (lambda h: h.update({"lm_head.weight": None}), r"corrupt safetensors header: tensor "
     r"lm_head.weight is None, not a mapping with dtype, shape and data_offsets"),
    (lambda h: h["lm_head.weight"].update(data_offsets=[0, 0, 0]), r"corrupt safetensors "
     r"header: tensor lm_head.weight has data_offsets \[0, 0, 0\], not \[begin, end\] with "
     r"0 <= begin <= end"),
    (lambda h: h["lm_head.weight"].update(data_offsets=[2**63, 0]), r"corrupt safetensors "
     r"header: tensor lm_head.weight has data_offsets \[9223372036854775808, 0\], not "
     r"\[begin, end\] with 0 <= begin <= end"),
    (lambda h: h["lm_head.weight"].update(shape=[400]), r"corrupt safetensors header: tensor "
     r"lm_head.weight spans bytes \d+ to \d+ \(102400 bytes\), but F32 of shape \(400,\) takes "
     r"1600"),
    (lambda h: h["lm_head.weight"].update(shape=["400", 64]), r"corrupt safetensors header: "
     r"tensor lm_head.weight has shape \['400', 64\], not a list of non-negative integers"),
    (lambda h: h.update({"__metadata__": [1]}), r"corrupt safetensors header: __metadata__ must "
     r"map strings to strings, got \[1\] \(at byte 8\)"),
    # was the native model's "lm_head must be (vocab, hidden)", without the file
    (lambda h: h["lm_head.weight"].update(shape=[64, 400]), r"tensor lm_head.weight has shape "
     r"\(64, 400\), but the model's config makes it \(400, 64\)"),
])
def test_safetensors_header_entries_are_checked(st_folder, edit, message):
    path = st_folder / "model.safetensors"
    _rewrite_header(path, edit)
    with pytest.raises(ValueError, match=refused(path, message)):
        load_checkpoint(st_folder)


def test_config_json_that_is_not_json_names_the_file(st_folder):
    path = st_folder / "config.json"
    path.write_text(path.read_text()[:-3])
    with pytest.raises(ValueError, match=refused(path, r"not valid JSON: .* \(line \d+, column "
                                                       r"\d+\)")):
        load_checkpoint(st_folder)
