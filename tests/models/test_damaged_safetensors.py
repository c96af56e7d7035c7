"""Damaged safetensors files, systematically (issue 55 item 2): the model.safetensors of tiny HF
Llama folders (fp32 and bf16) truncated, bit-flipped, with another header length, and with one
entry of its JSON header edited: a tensor's dtype, shape or data_offsets set to values that run
past the buffer, disagree with shape x dtype or with the model's config (a transposed or
reshaped weight of the same size), entries deleted, renamed or replaced by any JSON. Every case
loads and runs a prompt through the native engine, or is refused with a ValueError naming the
file and where in it (a byte offset or a tensor); never another exception, a hang or a crash.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from file_damage import (
    SETTINGS,
    EditDocument,
    Field,
    Outcomes,
    bit_flips,
    document_edits,
    json_values,
    load_and_run,
    replace_file,
    scaled,
    truncations,
)

pytestmark = pytest.mark.slow  # 5-10 s per variant on 2 cores

CASES = scaled(500)  # per variant: 1000 safetensors cases
LOCATOR = r"\bbytes? \d+|\btensors?\b|header length"
DTYPES = ["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "U16", "U32", "BOOL",
          "F8_E4M3", "U64", "f32", ""]


def split(data: bytes) -> tuple[dict, bytes]:
    """(the JSON header, the data after it) of a safetensors file."""
    (n,) = struct.unpack_from("<Q", data)
    return json.loads(data[8:8 + n]), data[8 + n:]


def join(header: object, body: bytes) -> bytes:
    """A safetensors file of this header (any JSON) and data, the header padded to 8 bytes."""
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob + body


def tensor_values(info: dict, body_size: int) -> st.SearchStrategy[tuple[str, object]]:
    """(key, value) for one tensor entry: shapes of the same size (transposed, flattened,
    split: a config mismatch) or not, data_offsets past the buffer, reversed or shifted, other
    dtypes."""
    shape, (start, end) = info["shape"], info["data_offsets"]
    numel = 1
    for d in shape:
        numel *= d
    same_size = [list(reversed(shape)), [numel], [1, numel], [numel // 2, 2] if numel % 2 == 0
                 else [numel], [2, numel // 2] if numel % 2 == 0 else [numel]]
    dims = st.one_of(st.integers(-2, 70), st.sampled_from([0, 2**31, 2**63, 2**64 + 1]))
    shapes = st.one_of(st.sampled_from(same_size), st.lists(dims, max_size=4),
                       st.just([*shape[:-1], shape[-1] + 1]), st.just([*shape, 1]))
    offsets = st.one_of(
        st.tuples(st.just(start), st.integers(end - 64, end + 64)),
        st.tuples(st.integers(start - 64, start + 64), st.just(end)),
        st.integers(-64, 64).map(lambda d: (start + d, end + d)),
        st.just((end, start)), st.just((start, body_size + 1)),
        st.just((body_size, body_size + end - start)),
        st.tuples(st.integers(-2, 2**64), st.integers(-2, 2**64)),
    ).map(list)
    return st.one_of(st.tuples(st.just("shape"), shapes),
                     st.tuples(st.just("data_offsets"), offsets),
                     st.tuples(st.just("dtype"), st.sampled_from(DTYPES)),
                     st.tuples(st.just("data_offsets"), st.one_of(
                         st.lists(st.integers(0, body_size), max_size=3), json_values)),
                     st.tuples(st.just("shape"), json_values))


def header_edits(header: dict, body_size: int) -> st.SearchStrategy[EditDocument]:
    names = sorted(k for k in header if k != "__metadata__")
    entry = st.sampled_from(names).flatmap(lambda name: tensor_values(
        header[name], body_size).map(lambda kv: EditDocument((name, kv[0]), kv[1])))
    return st.one_of(entry, entry, document_edits(header))


@pytest.fixture(params=["llama", "llama_bf16"])
def folder_and_file(request, tiny_model_dir, tmp_path) -> tuple[Path, bytes]:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir(request.param), folder)
    return folder, (folder / "model.safetensors").read_bytes()


def test_damaged_safetensors_is_loaded_or_refused_by_name(folder_and_file):
    folder, data = folder_and_file
    header, body = split(data)
    hot = len(data) - len(body)
    assert join(header, body) == data  # the writer's layout: edits change nothing else
    damage = st.one_of(
        truncations(len(data)), bit_flips(len(data), hot),
        Field("header length", 0, "<Q").values(data),
        header_edits(header, len(body)).map(lambda e: Rewrite(e, body)),
        header_edits(header, len(body)).map(lambda e: Rewrite(e, body)))
    outcomes = Outcomes()
    path = folder / "model.safetensors"

    @settings(SETTINGS, max_examples=CASES)
    @given(damage)
    def case(change):
        note(f"damage: {change!r}")
        replace_file(path, change.apply(data))
        outcomes.check(lambda: load_and_run(folder), path, LOCATOR)

    case()
    print(outcomes.summary("damaged safetensors files"))
    assert outcomes.cases >= CASES
    assert outcomes.counts["refused"] > CASES // 2  # most damage is found, not run
    assert outcomes.counts["loaded"] > 0  # and the engine ran on what was not


class Rewrite:
    """A header edit: the file rewritten with the edited header and the same data."""

    def __init__(self, edit: EditDocument, body: bytes):
        self.edit, self.body = edit, body

    def __repr__(self) -> str:
        return f"Rewrite({self.edit!r})"

    def apply(self, data: bytes) -> bytes:
        header, body = split(data)
        return join(self.edit.apply(header), body)
