"""Damaged compressed-tensors checkpoints, systematically (issue 55 item 2): a tiny Llama
compressed into every stored form sparsellm reads and runs (int8 per channel with and without
zero points and int8 activations, int4 groups packed in int32 with and without zero points,
unstructured and 2:4 sparsity of int8, int4 and fp32 weights, stored as bitmasks or densely, an
int8 embedding), then its config.json's
`quantization_config` (with the `sparsity_config` inside it) edited node by node (any JSON, and
values near the valid ones: bits, group sizes, strategies, formats, targets), cut short or
bit-flipped inside that section, and the stored parts whose values are shapes and offsets
(`weight_shape`, the bitmask's `shape` and `row_offsets`) and the scales' header shapes set to
other values. Every case loads and runs a prompt through the native engine, or is refused with
a ValueError naming the file (config.json or model.safetensors); never another exception, a
hang or a crash.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from file_damage import (
    SETTINGS,
    EditDocument,
    Field,
    FlipBits,
    Outcomes,
    Truncate,
    document_edits,
    json_values,
    load_and_run,
    paths_in,
    replace_file,
    scaled,
)
from sparsellm.compression.magnitude import magnitude_prune
from sparsellm.compression.quantize import rtn_quantize
from sparsellm.compression.save import CompressedModel, save_compressed
from sparsellm.models import load_checkpoint
from sparsellm.models.formats import WeightFormat

pytestmark = pytest.mark.slow  # 10-20 s per stored sparsity format on 2 cores

CASES = scaled(500)  # per sparsity format: 1000 compressed-tensors cases
SECTION = "quantization_config"

# Values near the valid ones for the keys of a quantization section.
NEAR_VALID = {
    "num_bits": [0, 1, 2, 3, 4, 5, 7, 8, 16, 32, -1, -8, None, "8", 8.5, True],
    "group_size": [None, 0, 1, -1, 3, 7, 8, 15, 16, 17, 32, 48, 64, 128, 4096, "16", 16.5],
    "strategy": ["group", "channel", "tensor", "token", "block", "tensor_group", None, 3],
    "symmetric": [True, False, None, 0, 1, "false"],
    "type": ["int", "float", None, 8],
    "format": ["int-quantized", "naive-quantized", "pack-quantized", "dense", "float-quantized",
               "sparse-bitmask", "mixed-precision", "marlin-24", None, 4],
    "targets": [[], ["Linear"], ["Embedding"], ["re:.*"], ["re:("], ["lm_head"], "Linear", None,
                [None], [["Linear"]], ["model.layers.0.mlp.up_proj"]],
    "ignore": [[], ["re:.*"], ["re:("], "lm_head", None, [3]],
    "quant_method": ["compressed-tensors", "sparseml", "gptq", None, 1],
    "config_groups": [{}, None, [], {"g": None}, {"g": {}}, {"g": {"targets": ["Linear"]}}],
    "weights": [None, {}, [], {"num_bits": 4}, {"num_bits": 8, "strategy": "group"}],
    "input_activations": [None, {}, {"num_bits": 4}, {"num_bits": 8}, 8],
    "sparsity_config": [None, {}, [], {"format": "sparse-bitmask"}, {"format": "dense"}],
}


def compressed_folder(source: Path, out: Path, sparsity_format: str) -> Path:
    """The tiny model with one stored form per linear weight (as tests/compression/
    test_formats.py round-trips them) and an int8 embedding."""
    ckpt = load_checkpoint(source)
    model = CompressedModel(ckpt, dict(ckpt.tensors), sparsity_format=sparsity_format)
    forms = [WeightFormat(bits=8, activation_bits=8), WeightFormat(bits=8, symmetric=False),
             WeightFormat(bits=8, sparsity="unstructured"),
             WeightFormat(bits=8, symmetric=False, sparsity="unstructured"),
             WeightFormat(bits=8, sparsity="2:4"), WeightFormat(bits=4, group_size=32),
             WeightFormat(bits=4, group_size=32, symmetric=False),
             WeightFormat(bits=4, group_size=32, sparsity="unstructured"),
             WeightFormat(sparsity="unstructured"), WeightFormat(sparsity="2:4")]
    names = [n for n in ckpt.tensors if n.endswith("_proj.weight")]
    for name, fmt in zip(names, forms, strict=False):
        w, keep = ckpt.tensors[name], None
        if fmt.sparsity == "2:4":
            w, keep = magnitude_prune(w, 0.0, 2, 4)
        elif fmt.sparsity:
            w, keep = magnitude_prune(w, 0.5)
        if fmt.bits < 32:
            qt = model.quantized[name] = rtn_quantize(w, fmt, mask=keep)
            w = qt.dequantize()
        elif keep is not None:
            model.masks[name] = keep
        model.formats[name], model.tensors[name] = fmt, w
    emb = "model.embed_tokens.weight"
    qt = model.quantized[emb] = rtn_quantize(ckpt.tensors[emb], WeightFormat(bits=8))
    model.tensors[emb], model.formats[emb] = qt.dequantize(), qt.format
    return save_compressed(model, out)


@pytest.fixture(scope="module", params=["sparse-bitmask", "dense"])
def compressed(request, tiny_model_dir, tmp_path_factory) -> Path:
    return compressed_folder(tiny_model_dir("llama"),
                             tmp_path_factory.mktemp("compressed") / "model", request.param)


def config_edits(config: dict) -> st.SearchStrategy[EditDocument]:
    """One node of the quantization section replaced by any JSON or by a value near a valid
    one for its key, deleted or renamed; or the whole section replaced."""
    paths = [(SECTION, *p) for p in paths_in(config[SECTION])]
    near = [p for p in paths if isinstance(p[-1], str) and p[-1] in NEAR_VALID]
    return st.one_of(
        st.sampled_from(near).flatmap(lambda p: st.sampled_from(NEAR_VALID[p[-1]]).map(
            lambda v: EditDocument(p, v))),
        document_edits(config[SECTION]).map(
            lambda e: EditDocument((SECTION, *e.path), e.value)),
        json_values.map(lambda v: EditDocument((SECTION,), v)))


def text_damage(text: bytes, config: dict) -> st.SearchStrategy[Truncate | FlipBits]:
    """config.json cut short or bit-flipped inside its quantization section."""
    start = text.index(f'"{SECTION}"'.encode())
    end = start + len(json.dumps({SECTION: config[SECTION]}))
    inside = st.integers(start, min(end, len(text)) - 1)
    return st.one_of(inside.map(Truncate), st.lists(st.tuples(inside, st.integers(0, 7)),
                                                    min_size=1, max_size=4, unique=True).map(
        lambda b: FlipBits(tuple(b))))


def stored_fields(data: bytes) -> tuple[list[Field], dict]:
    """The integer values of the stored parts that are shapes and offsets (`weight_shape`,
    `shape`, `row_offsets`) as fields of the safetensors file, and its header."""
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + n])
    fields = []
    for name, info in header.items():
        if name.endswith((".weight_shape", ".shape", ".row_offsets")):
            fmt = {"I64": "<q", "I32": "<i"}[info["dtype"]]
            start, end = info["data_offsets"]
            size = struct.calcsize(fmt)
            fields += [Field(f"{name.rsplit('.', 1)[1]}:{name}[{i}]", 8 + n + start + size * i,
                             fmt) for i in range((end - start) // size)][:8]
    return fields, header


class Reshape:
    """A stored part's header shape set to another of the same size (its bytes unchanged)."""

    def __init__(self, name: str, shape: list[int]):
        self.name, self.shape = name, shape

    def __repr__(self) -> str:
        return f"Reshape({self.name!r}, {self.shape})"

    def apply(self, data: bytes) -> bytes:
        (n,) = struct.unpack_from("<Q", data)
        header = json.loads(data[8:8 + n])
        header[self.name]["shape"] = self.shape
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        return struct.pack("<Q", len(blob)) + blob + data[8 + n:]


def reshapes(header: dict) -> st.SearchStrategy[Reshape]:
    names = sorted(k for k, v in header.items() if k != "__metadata__" and
                   k.rsplit(".", 1)[1] in ("weight_scale", "weight_zero_point", "weight_packed",
                                           "bitmask", "compressed", "weight"))

    def same_size(name: str) -> st.SearchStrategy[Reshape]:
        shape = header[name]["shape"]
        numel = int(np.prod(shape))
        options = [list(reversed(shape)), [numel], [numel, 1], [1, numel]]
        options += [[numel // d, d] for d in (2, 4, 8, 16) if numel % d == 0]
        return st.sampled_from(options).map(lambda s: Reshape(name, s))

    return st.sampled_from(names).flatmap(same_size)


class EditConfig:
    def __init__(self, edit: EditDocument):
        self.edit = edit

    def __repr__(self) -> str:
        return f"EditConfig({self.edit!r})"

    def apply(self, text: bytes) -> bytes:
        return json.dumps(self.edit.apply(json.loads(text)), indent=2).encode()


def test_damaged_compressed_tensors_is_loaded_or_refused_by_name(compressed, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(compressed, folder)
    config_path, weights_path = folder / "config.json", folder / "model.safetensors"
    text, data = config_path.read_bytes(), weights_path.read_bytes()
    config = json.loads(text)
    assert SECTION in config and "sparsity_config" in config[SECTION]
    fields, header = stored_fields(data)
    assert {f.label.split(":")[0] for f in fields} >= {"weight_shape"}
    damage = st.one_of(
        config_edits(config).map(lambda e: ("config", EditConfig(e))),
        config_edits(config).map(lambda e: ("config", EditConfig(e))),
        text_damage(text, config).map(lambda d: ("config", d)),
        st.sampled_from(fields).flatmap(lambda f: f.values(data)).map(lambda d: ("weights", d)),
        reshapes(header).map(lambda d: ("weights", d)))
    outcomes = Outcomes()

    @settings(SETTINGS, max_examples=CASES)
    @given(damage)
    def case(change):
        note(f"damage: {change!r}")
        which, damage = change
        replace_file(config_path, damage.apply(text) if which == "config" else text)
        replace_file(weights_path, damage.apply(data) if which == "weights" else data)
        # (a config that disagrees with the stored parts may be refused by either file)
        outcomes.check(lambda: load_and_run(folder), [config_path, weights_path]
                       if which == "config" else weights_path)

    case()
    print(outcomes.summary("damaged compressed-tensors checkpoints"))
    assert outcomes.cases >= CASES
    assert outcomes.counts["refused"] > CASES // 4  # many edits are found, not run
    assert outcomes.counts["loaded"] > 0  # and the engine ran on what was not
