"""compressed-tensors storage: codecs, write -> load round trips of every stored form, reading
llm-compressor style checkpoints, and atomic writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from sparsellm.compression.magnitude import magnitude_prune
from sparsellm.compression.quantize import rtn_quantize
from sparsellm.compression.save import CompressedModel, save_compressed
from sparsellm.models import load_checkpoint
from sparsellm.models.compressed import (
    bitmask_compress,
    bitmask_decompress,
    pack_int32,
    unpack_int32,
)
from sparsellm.models.formats import WeightFormat
from sparsellm.models.safetensors_io import read_safetensors, write_safetensors


def test_pack_int32_layout():
    q = np.array([[-8, -7, 0, 1, 2, 3, 6, 7, 5]], dtype=np.int8)
    packed = pack_int32(q, 4)
    assert packed.dtype == np.int32 and packed.shape == (1, 2)
    word = int(packed[0, 0]) & 0xFFFFFFFF
    assert [(word >> (4 * i)) & 0xF for i in range(8)] == [0, 1, 8, 9, 10, 11, 14, 15]
    np.testing.assert_array_equal(unpack_int32(packed, 4, 9), q)
    rng = np.random.default_rng(0)
    for bits in (4, 8):
        v = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (13, 21)).astype(np.int8)
        np.testing.assert_array_equal(unpack_int32(pack_int32(v, bits), bits, 21), v)
        col = pack_int32(v, bits, axis=0)
        assert col.shape == (-(-13 // (32 // bits)), 21)
        np.testing.assert_array_equal(unpack_int32(col, bits, 13, axis=0), v)


def test_bitmask_layout():
    dense = np.array([[0, 1.5, 0, 0, 0, 0, 0, 0, 2.0], [3.0, 0, 0, 0, 0, 0, 0, 0, 0]],
                     dtype=np.float32)
    parts = bitmask_compress(dense, dense != 0)
    assert parts["bitmask"].dtype == np.uint8 and parts["bitmask"].shape == (2, 2)
    assert parts["bitmask"][0].tolist() == [0b10, 0b1]  # little bit order per row
    assert parts["compressed"].tolist() == [1.5, 2.0, 3.0]
    assert parts["row_offsets"].tolist() == [0, 2] and parts["shape"].tolist() == [2, 9]
    back, keep = bitmask_decompress(parts)
    np.testing.assert_array_equal(back, dense)
    np.testing.assert_array_equal(keep, dense != 0)


def _variants(ckpt):
    """One compressed form per linear of the tiny model."""
    names = [n for n in ckpt.tensors if n.endswith("_proj.weight")]
    forms = [
        ("int8", WeightFormat(bits=8, activation_bits=8), 0.0),
        ("int8_asym", WeightFormat(bits=8, symmetric=False), 0.0),
        ("int8_sparse", WeightFormat(bits=8, sparsity="unstructured"), 0.5),
        ("int8_asym_sparse", WeightFormat(bits=8, symmetric=False, sparsity="unstructured"), 0.5),
        ("int4", WeightFormat(bits=4, group_size=16), 0.0),
        ("int4_asym", WeightFormat(bits=4, group_size=32, symmetric=False), 0.0),
        ("int4_sparse24", WeightFormat(bits=4, group_size=16, symmetric=False, sparsity="2:4"),
         "2:4"),
        ("fp32_sparse", WeightFormat(sparsity="unstructured"), 0.5),
        ("fp32_24", WeightFormat(sparsity="2:4"), "2:4"),
    ]
    return list(zip(names, forms, strict=False))


@pytest.mark.parametrize("sparsity_format", ["dense", "sparse-bitmask"])
def test_round_trip_every_stored_form(tiny_model, tmp_path, sparsity_format):
    ckpt = load_checkpoint(tiny_model)
    model = CompressedModel(ckpt, dict(ckpt.tensors), sparsity_format=sparsity_format)
    for name, (_, fmt, sparsity) in _variants(ckpt):
        w = ckpt.tensors[name]
        keep = None
        if sparsity == "2:4":
            w, keep = magnitude_prune(w, 0.0, 2, 4)
        elif sparsity:
            w, keep = magnitude_prune(w, sparsity)
        if fmt.bits < 32:
            qt = rtn_quantize(w, fmt, mask=keep)
            model.quantized[name] = qt
            w = qt.dequantize()
        elif keep is not None:
            model.masks[name] = keep
        model.formats[name] = fmt
        model.tensors[name] = w
    emb = "model.embed_tokens.weight"
    model.quantized[emb] = rtn_quantize(ckpt.tensors[emb], WeightFormat(bits=8, symmetric=False))
    model.tensors[emb] = model.quantized[emb].dequantize()
    model.formats[emb] = model.quantized[emb].format
    out = save_compressed(model, tmp_path / "out")
    loaded = load_checkpoint(out)
    assert set(loaded.tensors) == set(ckpt.tensors)
    for name, w in model.tensors.items():
        np.testing.assert_array_equal(loaded.tensors[name], w, err_msg=name)
    assert loaded.weight_formats == model.formats
    for name, qt in model.quantized.items():
        got = loaded.quantized[name]
        np.testing.assert_array_equal(got.q, qt.q, err_msg=name)
        np.testing.assert_array_equal(got.scale, qt.scale)
        if qt.mask is not None:
            assert not (got.mask & ~qt.mask).any()  # stored mask: the kept nonzeros
    stored = read_safetensors(out / "model.safetensors")
    kinds = {k.rsplit(".", 1)[-1] for k in stored}
    bitmask_parts = {"bitmask", "compressed", "row_offsets", "shape"}
    assert {"weight_packed", "weight_shape", "weight_scale", "weight_zero_point",
            "weight"} <= kinds
    assert (bitmask_parts <= kinds) == (sparsity_format == "sparse-bitmask")
    assert not (bitmask_parts & kinds) or sparsity_format == "sparse-bitmask"
    config = json.loads((out / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "mixed-precision"
    assert qc["sparsity_config"]["format"] == sparsity_format


def _write_folder(folder, tiny_model, config_extra, tensors):
    folder.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (folder / f).write_text((tiny_model / f).read_text())
    config = json.loads((tiny_model / "config.json").read_text())
    config.update(config_extra)
    (folder / "config.json").write_text(json.dumps(config))
    write_safetensors(folder / "model.safetensors", tensors)


def _reference_compressed(ckpt, scheme, compressor, fp16_scales=False):
    """Every linear of `ckpt` compressed by compressed-tensors itself (the format's owner, as
    llm-compressor calls it): the stored tensors, and the weights its own quantize/dequantize
    define (float32)."""
    import torch
    from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    args = scheme.weights
    tensors, expected = {}, {}
    for name, w in ckpt.tensors.items():
        if not name.endswith("_proj.weight"):
            tensors[name] = w
            continue
        wt = torch.from_numpy(np.array(w, dtype=np.float32))  # a writable copy
        g = args.group_size or wt.shape[1]
        blocks = wt.reshape(wt.shape[0], -1, g)
        lo, hi = blocks.amin(-1), blocks.amax(-1)
        if args.symmetric:
            lo, hi = -torch.maximum(-lo, hi), torch.maximum(-lo, hi)
        scale, zp = calculate_qparams(lo, hi, args)
        if fp16_scales:  # llm-compressor stores scales in the model's half dtype
            scale = scale.half()
        stored = compressor.compress({"weight": wt, "weight_scale": scale,
                                      "weight_zero_point": zp}, scheme)
        m = name[:-len(".weight")]
        tensors.update({f"{m}.{k}": v.numpy() for k, v in stored.items()})
        q = quantize(x=wt, scale=scale.float(), zero_point=zp, args=args, dtype=torch.int8)
        expected[name] = dequantize(x_q=q, scale=scale.float(), zero_point=zp,
                                    args=args).float().numpy()
    return tensors, expected


def test_reads_pack_quantized_written_by_compressed_tensors(tiny_model, tmp_path):
    """int4 group-asymmetric weights, packed (values and zero points) by compressed-tensors'
    own compressor and described by its own config model: not a round trip of our packer."""
    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
    )

    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", symmetric=False, strategy="group", group_size=32))
    ckpt = load_checkpoint(tiny_model)
    tensors, expected = _reference_compressed(ckpt, scheme, PackedQuantizationCompressor,
                                              fp16_scales=True)
    packed = [k for k in tensors if k.endswith(".weight_packed")]
    assert packed and tensors[packed[0]].dtype == np.int32
    assert {tensors[k.replace("packed", "zero_point")].shape[0] for k in packed} == {
        -(-tensors[k.replace("packed", "scale")].shape[0] // 8) for k in packed}  # 8 per int32
    config = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized",
                                quantization_status="compressed", ignore=["lm_head"])
    _write_folder(tmp_path / "m", tiny_model,
                  {"quantization_config": config.model_dump(exclude_none=True)}, tensors)
    loaded = load_checkpoint(tmp_path / "m")
    assert set(expected) == {n for n in ckpt.tensors if n.endswith("_proj.weight")}
    for name, w in expected.items():
        np.testing.assert_array_equal(loaded.tensors[name], w, err_msg=name)
        assert loaded.weight_formats[name] == WeightFormat(bits=4, group_size=32,
                                                           symmetric=False)
    assert "lm_head.weight" not in loaded.weight_formats


def test_reads_int_quantized_w8a8_written_by_compressed_tensors(tiny_model, tmp_path):
    from compressed_tensors.compressors import IntQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig

    scheme = _w8a8_scheme()
    ckpt = load_checkpoint(tiny_model)
    tensors, expected = _reference_compressed(ckpt, scheme, IntQuantizationCompressor)
    config = QuantizationConfig(config_groups={"group_0": scheme}, format="int-quantized",
                                quantization_status="compressed", ignore=["lm_head"])
    _write_folder(tmp_path / "m", tiny_model,
                  {"quantization_config": config.model_dump(exclude_none=True)}, tensors)
    loaded = load_checkpoint(tmp_path / "m")
    for name, w in expected.items():
        assert tensors[name].dtype == np.int8  # stored as int8 `weight` + `weight_scale`
        np.testing.assert_allclose(loaded.tensors[name], w, rtol=1e-6, atol=0, err_msg=name)
        assert loaded.weight_formats[name] == WeightFormat(bits=8, activation_bits=8)


@pytest.mark.parametrize("strategy", ["group", "tensor"])
def test_reads_int8_group_and_tensor_scales_written_by_compressed_tensors(tiny_model, tmp_path,
                                                                         strategy):
    """int8 with one scale per group of 32 columns or per tensor: the exact values are read,
    and the engine runs them in its per-channel int8 kernels (group scales requantized)."""
    from compressed_tensors.compressors import IntQuantizationCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
    )

    from sparsellm.engine import Engine
    from sparsellm.kernels.reference import dequantize

    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=8, type="int", symmetric=True, strategy=strategy,
        group_size=32 if strategy == "group" else None))
    ckpt = load_checkpoint(tiny_model)
    tensors, expected = _reference_compressed(ckpt, scheme, IntQuantizationCompressor)
    config = QuantizationConfig(config_groups={"group_0": scheme}, format="int-quantized",
                                quantization_status="compressed", ignore=["lm_head"])
    _write_folder(tmp_path / "m", tiny_model,
                  {"quantization_config": config.model_dump(exclude_none=True)}, tensors)
    loaded = load_checkpoint(tmp_path / "m")
    for name, w in expected.items():
        np.testing.assert_allclose(loaded.tensors[name], w, rtol=1e-6, atol=0, err_msg=name)
    engine = Engine(loaded, sequence_length=32, weights_cache=False)
    for name, w in expected.items():  # per channel, within half a step of the stored values
        packed = engine.model.packed[name]
        assert packed.format == "int8"
        step = packed.arrays["scale"][:, None]
        assert (np.abs(dequantize(packed)[:, :w.shape[1]] - w) <= 0.5001 * step).all(), name


def test_reads_dense_stored_sparse_and_int8(tiny_model, tmp_path):
    ckpt = load_checkpoint(tiny_model)
    tensors = dict(ckpt.tensors)
    sparse_name = "model.layers.0.mlp.up_proj.weight"
    tensors[sparse_name], _ = magnitude_prune(tensors[sparse_name], 0, 2, 4)
    int_name = "model.layers.1.mlp.down_proj.weight"
    qt = rtn_quantize(tensors.pop(int_name), WeightFormat(bits=8))
    tensors[int_name] = qt.q
    tensors[int_name[:-7] + ".weight_scale"] = qt.scale
    qconfig = {"quantization_config": {
        "quant_method": "compressed-tensors", "format": "int-quantized",
        "config_groups": {"g": {"targets": ["re:.*down_proj$"], "weights": {"num_bits": 8},
                                "input_activations": {"num_bits": 8, "strategy": "token",
                                                      "dynamic": True}}},
        "sparsity_config": {"format": "dense", "sparsity_structure": "2:4",
                            "targets": ["Linear"], "ignore": ["lm_head"]}}}
    _write_folder(tmp_path / "m", tiny_model, qconfig, tensors)
    loaded = load_checkpoint(tmp_path / "m")
    assert loaded.weight_formats[sparse_name] == WeightFormat(sparsity="2:4")
    assert loaded.weight_formats[int_name] == WeightFormat(bits=8, activation_bits=8)
    np.testing.assert_array_equal(loaded.tensors[int_name], qt.dequantize())
    assert "model.layers.0.mlp.gate_proj.weight" not in loaded.weight_formats


def test_corrupt_scales_are_refused(tiny_model, tmp_path):
    """Garbage scales (llm-compressor 0.14 writes some for a quantized Embedding) are refused by
    name instead of running to NaN logits."""
    ckpt = load_checkpoint(tiny_model)
    tensors = dict(ckpt.tensors)
    name = "model.layers.1.mlp.down_proj.weight"
    qt = rtn_quantize(tensors.pop(name), WeightFormat(bits=8))
    tensors[name] = qt.q
    tensors[name[:-7] + ".weight_scale"] = np.where(np.arange(qt.scale.size)[:, None] == 3,
                                                     np.float32(-4e37), qt.scale)
    _write_folder(tmp_path / "m", tiny_model, {"quantization_config": {
        "quant_method": "compressed-tensors", "format": "int-quantized",
        "config_groups": {"g": {"targets": ["re:.*down_proj$"], "weights": {"num_bits": 8}}}}},
        tensors)
    with pytest.raises(ValueError, match=r"down_proj.weight_scale has 1 negative or non-finite"):
        load_checkpoint(tmp_path / "m").tensors[name]


def test_unsupported_formats_are_clear(tiny_model, tmp_path):
    _write_folder(tmp_path / "a", tiny_model, {"quantization_config": {"quant_method": "awq"}},
                  dict(load_checkpoint(tiny_model).tensors))
    with pytest.raises(ValueError, match="quant_method 'awq' is not supported"):
        load_checkpoint(tmp_path / "a")
    _write_folder(tmp_path / "b", tiny_model, {"quantization_config": {
        "quant_method": "compressed-tensors",
        "sparsity_config": {"format": "marlin-24"}}}, dict(load_checkpoint(tiny_model).tensors))
    with pytest.raises(ValueError, match="sparsity format 'marlin-24' is not supported"):
        load_checkpoint(tmp_path / "b")


# ---- found by tests/models/test_damaged_compressed.py (issue 55 item 2) ----------------------
ASYM_INT4 = "model.layers.0.mlp.up_proj.weight"
FLOAT_24 = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture
def int4_and_24_folder(tiny_model, tmp_path) -> Path:
    """int4 groups with zero points (packed as compressed-tensors packs them) and a 2:4-pruned
    float weight (stored densely)."""
    ckpt = load_checkpoint(tiny_model)
    model = CompressedModel(ckpt, dict(ckpt.tensors))
    qt = model.quantized[ASYM_INT4] = rtn_quantize(
        ckpt.tensors[ASYM_INT4], WeightFormat(bits=4, group_size=32, symmetric=False))
    model.tensors[ASYM_INT4], model.formats[ASYM_INT4] = qt.dequantize(), qt.format
    assert qt.q.min() < 0  # signed, as compressed-tensors stores them
    w, keep = magnitude_prune(ckpt.tensors[FLOAT_24], 0.0, 2, 4)
    model.tensors[FLOAT_24], model.masks[FLOAT_24] = w, keep
    model.formats[FLOAT_24] = WeightFormat(sparsity="2:4")
    return save_compressed(model, tmp_path / "out")


def test_asymmetric_int4_and_2_4_float_weights_run_natively(int4_and_24_folder):
    """The kernels' int4 nibbles hold [0, 15]: the signed integers are offset by 8 with their
    zero points (was "int4_g32_asym: q must be in [0, 15]"); a 2:4 float weight, which has no
    2:4 kernel, runs as the bitmask it also is (was "unknown weight format '2:4_fp32'")."""
    from sparsellm.engine import Engine

    native = Engine(int4_and_24_folder, sequence_length=16, weights_cache=False,
                    dynamic_int8=False)  # fp32 activations, as the reference
    reference = Engine(int4_and_24_folder, sequence_length=16, backend="numpy")
    assert native.formats[ASYM_INT4] == "int4_g32_asym"
    assert native.formats[FLOAT_24] == "sparse_fp32"
    ids = [1, 5, 9, 2, 7]
    got = native.prefill(native.add_sequence(), ids)
    want = reference.prefill(reference.add_sequence(), ids)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_packed_weight_shape_that_disagrees_with_its_parts_is_refused(int4_and_24_folder):
    """A weight_shape whose columns do not fill the packed words was decoded to a shorter
    weight and failed later as a NumPy reshape error."""
    path = int4_and_24_folder / "model.safetensors"
    stored = read_safetensors(path)
    name = ASYM_INT4[:-len("weight")] + "weight_shape"
    stored[name] = stored[name] - np.array([0, 8])
    write_safetensors(path, stored)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: tensor {ASYM_INT4}_packed "
                                         r"is int32 of shape "
                                         r"\(128, 8\); 4-bit values of a \(128, 56\) weight pack "
                                         r"into int32 of shape \(128, 7\)$"):
        load_checkpoint(int4_and_24_folder)


@pytest.mark.parametrize("edit, message", [
    # was a TypeError (int(None)), an AttributeError ('int'.startswith), re.error or a silent
    # truthiness ("no" is true)
    ({"num_bits": None}, r"config_groups.g.weights.num_bits is None; "
     r"supported: 4, 8"),
    ({"num_bits": 3}, r"config_groups.g.weights.num_bits is 3; supported: 4, 8"),
    ({"symmetric": "no"}, r"config_groups.g.weights.symmetric is 'no'; expected true or false"),
    ({"strategy": "group", "group_size": 0}, r"config_groups.g.weights.group_size is 0; "
     r"expected a positive integer or null"),
    ({"targets": [3]}, r"config_groups.g.targets is \[3\]; expected a list of module names"),
    ({"targets": ["re:("]}, r"config_groups.g.targets is \['re:\('\]; 're:\(' is not a regular "
     r"expression"),
])
def test_compression_config_errors_name_config_json_and_the_key(tiny_model, tmp_path, edit,
                                                                message):
    ckpt = load_checkpoint(tiny_model)
    tensors = dict(ckpt.tensors)
    name = "model.layers.1.mlp.down_proj.weight"
    qt = rtn_quantize(tensors.pop(name), WeightFormat(bits=8))
    tensors[name], tensors[name[:-7] + ".weight_scale"] = qt.q, qt.scale
    group = {"targets": ["re:.*down_proj$"], "weights": {"num_bits": 8}}
    for key, value in edit.items():
        (group if key == "targets" else group["weights"])[key] = value
    _write_folder(tmp_path / "m", tiny_model, {"quantization_config": {
        "quant_method": "compressed-tensors", "format": "int-quantized",
        "config_groups": {"g": group}}}, tensors)
    config = re.escape(str(tmp_path / "m" / "config.json"))
    with pytest.raises(ValueError, match=rf"^{config}: quantization_config.{message}"):
        load_checkpoint(tmp_path / "m")


def test_interrupted_write_leaves_nothing(tiny_model, tmp_path, monkeypatch):
    import sparsellm.compression.save as save

    ckpt = load_checkpoint(tiny_model)
    model = CompressedModel(ckpt, dict(ckpt.tensors))

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(save, "write_tokenizer", boom)
    with pytest.raises(KeyboardInterrupt):
        save.save_compressed(model, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
    # An existing folder survives an interrupted overwrite untouched.
    monkeypatch.undo()
    first = save.save_compressed(model, tmp_path / "out")
    before = sorted(p.name for p in first.iterdir())
    monkeypatch.setattr(save, "write_tokenizer", boom)
    with pytest.raises(KeyboardInterrupt):
        save.save_compressed(model, tmp_path / "out", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    with pytest.raises(ValueError, match="already exists"):
        save.save_compressed(model, tmp_path / "out")


# ---- interop with transformers + compressed-tensors ---------------------------------------------
@pytest.fixture
def no_warnings(caplog):
    """Fails the test if anything logs a warning, transformers included (its loggers do not
    propagate to the root logger unless told to: its load report of missing and unexpected
    keys would pass unseen)."""
    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING):
            yield
    finally:
        hf_logging.disable_propagation()
    warned = [r.getMessage() for r in caplog.get_records("call") if r.levelno >= logging.WARNING]
    assert not warned, warned


def _w8a8_scheme():
    """compressed-tensors' W8A8: int8 per-channel weights, dynamic per-token int8 inputs."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    return QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="channel"),
        input_activations=QuantizationArgs(num_bits=8, type="int", symmetric=True,
                                           strategy="token", dynamic=True))


def _hf_and_ours(folder, ids):
    """Logits of `folder` from transformers and from sparsellm, each as the checkpoint declares
    (W8A8: compressed-tensors fake-quantizes the activations) and with activation quantization
    off on both sides (the exact weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    from sparsellm.engine import Engine

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = {}
    for mode, weights in (("w8a8", None), ("w8", "fp32")):
        if weights:
            for module in hf.modules():
                module.quantization_enabled = False  # compressed-tensors' switch
        with torch.no_grad():
            theirs = hf(torch.tensor([ids])).logits[0].numpy()
        engine = Engine(folder, sequence_length=64, weights=weights, weights_cache=False)
        ours = engine.prefill(engine.add_sequence(), ids, all_logits=True)
        out[mode] = ours, theirs
    return out


def _agree(out, ids):
    """W8: the same weights (to float rounding). W8A8: the same greedy token at almost every
    position, and much closer to compressed-tensors' quantized activations than to none (a
    tiny model flips a rounding on 1-ulp input differences, so not bit-exact)."""
    ours, theirs = out["w8"]
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4 * np.abs(theirs).max())
    no_act = theirs
    ours, theirs = out["w8a8"]
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= 0.9
    assert np.abs(ours - theirs).mean() < 0.5 * np.abs(no_act - theirs).mean()


@pytest.mark.parametrize("tied", [False, True])
def test_our_output_loads_in_transformers(tiny_model, tiny_tied_model, calib_texts, tmp_path,
                                          tied, no_warnings):
    """SparseGPT 50% + W8A8 with an int8 embedding, written in the default (dense) layout:
    current transformers + compressed-tensors load it with no warning and compute what we do.
    A tied model's quantized embedding is written untied (transformers would tie the lm_head
    to the compressed int8 parameter)."""
    from sparsellm.compression import compress

    recipe = (Path(__file__).parents[2] / "examples/recipes/sparsegpt50_w8a8.yaml").read_text()
    src = tiny_tied_model if tied else tiny_model
    out = compress(str(src), calib_texts, recipe, tmp_path / "out", num_calibration_samples=4,
                   max_seq_length=32, progress=False).output_dir
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["sparsity_config"]["format"] == "dense"
    assert config.get("tie_word_embeddings") is False or not tied
    stored = read_safetensors(out / "model.safetensors")
    assert stored["model.layers.0.mlp.up_proj.weight"].dtype == np.int8
    assert stored["model.embed_tokens.weight"].dtype == np.int8
    ids = load_checkpoint(out).tokenizer.encode("".join(calib_texts[:6]))[:40]
    _agree(_hf_and_ours(out, ids), ids)


def test_llm_compressor_output_loads_here_like_in_transformers(tiny_model, calib_texts,
                                                               tmp_path, no_warnings):
    """A 50%-sparse W8A8 model as llm-compressor writes it today (int-quantized on
    compressed-tensors' grid, so -128 is a weight; sparsity stored densely and described in
    sparsity_config): loaded with no clamping (no warning) and run like transformers runs it."""
    from compressed_tensors.compressors import IntQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig

    scheme = _w8a8_scheme()
    ckpt = load_checkpoint(tiny_model)
    pruned = ckpt.with_tensors({n: magnitude_prune(w, 0.5)[0] if n.endswith("_proj.weight")
                                else w for n, w in ckpt.tensors.items()})
    tensors, _ = _reference_compressed(pruned, scheme, IntQuantizationCompressor)
    assert any((tensors[n] == -128).any() for n in tensors if n.endswith("_proj.weight"))
    config = QuantizationConfig(config_groups={"group_0": scheme}, format="int-quantized",
                                quantization_status="compressed", ignore=["lm_head"])
    sparsity = {"format": "dense", "sparsity_structure": "unstructured", "global_sparsity": 0.5,
                "targets": ["Linear"], "ignore": ["lm_head"]}
    _write_folder(tmp_path / "m", tiny_model, {"quantization_config": {
        **config.model_dump(exclude_none=True), "sparsity_config": sparsity}}, tensors)
    ids = ckpt.tokenizer.encode("".join(calib_texts[:6]))[:40]
    loaded = load_checkpoint(tmp_path / "m")
    assert loaded.weight_formats["model.layers.0.mlp.up_proj.weight"].name == "sparse_int8_a8"
    _agree(_hf_and_ours(tmp_path / "m", ids), ids)
