"""Damaged GGUF files, systematically (issue 55 item 2): tiny Llama GGUFs (F32, and Q4_0 whose
exact integers run natively) truncated, bit-flipped, and with one header field set to another
value: a count, a string or array length, a value type, a metadata value (the model's sizes),
a tensor's number of dimensions, a dimension, its ggml type or its data offset. Every case loads
and runs a prompt through the native engine, or is refused with a ValueError naming the file
and where in it (a byte offset, a tensor or a key); never another exception, a hang or a crash.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from file_damage import (
    SETTINGS,
    Field,
    Outcomes,
    bit_flips,
    field_changes,
    load_and_run,
    replace_file,
    scaled,
    truncations,
)

pytestmark = pytest.mark.slow  # 5-10 s per file type on 2 cores

CASES = scaled(500)  # per file type: 1000 GGUF cases
# Where a GGUF error says the damage is: a byte offset, a tensor, a metadata key, or the magic
# (the first 4 bytes).
LOCATOR = r"\bbytes? \d+|\btensors?\b|\bkeys?\b|^\S+: not a GGUF file"

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q",
            11: "<q", 12: "<d"}


def gguf_fields(data: bytes) -> list[Field]:
    """Every fixed-size field of a GGUF header, labelled by kind: the header's counts, each
    key/value's key length, type and value (arrays: element type, count and the first elements'
    lengths or values), each tensor's name length, dimensions, type and offset."""
    fields = [Field("header:version", 4, "<I"), Field("header:tensor count", 8, "<Q"),
              Field("header:key/value count", 16, "<Q")]
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    off = 24

    def string(label: str) -> str:
        nonlocal off
        (n,) = struct.unpack_from("<Q", data, off)
        fields.append(Field(f"string length:{label}", off, "<Q"))
        text = data[off + 8:off + 8 + n].decode()
        off += 8 + n
        return text

    def value(kind: int, key: str, depth: int = 0) -> None:
        nonlocal off
        if kind in _SCALARS:
            if depth < 2:
                fields.append(Field(f"value:{key}", off, _SCALARS[kind]))
            off += struct.calcsize(_SCALARS[kind])
        elif kind == 8:
            if depth < 2:
                string(key)
            else:
                off += 8 + struct.unpack_from("<Q", data, off)[0]
        else:
            item, count = struct.unpack_from("<IQ", data, off)
            fields.append(Field(f"array type:{key}", off, "<I"))
            fields.append(Field(f"array count:{key}", off + 4, "<Q"))
            off += 12
            for i in range(count):
                value(item, f"{key}[{i}]", depth + (1 if i < 3 else 2))

    for _ in range(n_kv):
        key = string("key")
        fields.append(Field(f"value type:{key}", off, "<I"))
        (kind,) = struct.unpack_from("<I", data, off)
        off += 4
        value(kind, key)
    for _ in range(n_tensors):
        name = string("tensor name")
        (n_dims,) = struct.unpack_from("<I", data, off)
        fields.append(Field(f"n_dims:{name}", off, "<I"))
        for d in range(n_dims):
            fields.append(Field(f"dim:{name}[{d}]", off + 4 + 8 * d, "<Q"))
        off += 4 + 8 * n_dims
        fields.append(Field(f"ggml type:{name}", off, "<I"))
        fields.append(Field(f"data offset:{name}", off + 4, "<Q"))
        off += 12
    return fields


def test_gguf_fields_are_where_gguf_reader_finds_them(tiny_gguf):
    import gguf

    path, _ = tiny_gguf("Q4_0")
    data = path.read_bytes()
    fields = {f.label: f for f in gguf_fields(data)}
    kinds = {label.split(":")[0] for label in fields}
    assert kinds == {"header", "string length", "value type", "value", "array type",
                     "array count", "n_dims", "dim", "ggml type", "data offset"}
    reader = gguf.GGUFReader(path)

    def at(label: str) -> int | float:
        f = fields[label]
        return struct.unpack_from(f.fmt, data, f.offset)[0]

    assert at("value:llama.block_count") == 2 and at("value:llama.embedding_length") == 64
    for t in reader.tensors:
        assert [at(f"dim:{t.name}[{d}]") for d in range(len(t.shape))] == t.shape.tolist()
        assert at(f"ggml type:{t.name}") == t.tensor_type
        assert at(f"data offset:{t.name}") == t.data_offset - reader.data_offset


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # flipped block scales: NaN or inf
@pytest.mark.parametrize("qtype", ["F32", "Q4_0"])
def test_damaged_gguf_is_loaded_or_refused_by_name(qtype, tiny_gguf, tmp_path):
    source, _ = tiny_gguf(qtype)
    data = source.read_bytes()
    fields = gguf_fields(data)
    header = fields[-1].offset + 8
    damage = st.one_of(truncations(len(data)), bit_flips(len(data), header),
                       field_changes(fields, data), field_changes(fields, data))
    outcomes = Outcomes()

    @settings(SETTINGS, max_examples=CASES)
    @given(damage)
    def case(change):
        note(f"damage: {change!r}")
        path = tmp_path / "model.gguf"
        replace_file(path, change.apply(data))
        outcomes.check(lambda: load_and_run(path), path, LOCATOR)

    case()
    print(outcomes.summary(f"damaged {qtype} GGUF files"))
    assert outcomes.cases >= CASES
    assert outcomes.counts["refused"] > CASES // 2  # most damage is found, not run
    assert outcomes.counts["loaded"] > 0  # and the engine ran on what was not
