"""Truncated and corrupt model files are refused when loaded, with the file, what is wrong and
where (issue 29): an interrupted download must not surface as a NumPy reshape error."""

from __future__ import annotations

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
    path.write_bytes(gguf_bytes[:200])  # inside the metadata (the vocabulary)
    pattern = refused(path, r"truncated GGUF header: the metadata runs past the end of the file "
                      r"\(200 bytes; an interrupted download or copy\?\)")
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
    pattern = refused(path, r"corrupt safetensors header: Expecting value at byte 8")
    with pytest.raises(ValueError, match=pattern):
        load_checkpoint(st_folder)
