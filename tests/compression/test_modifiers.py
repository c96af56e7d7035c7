"""The modifier contract: a modifier plans its own steps (`Modifier.plan`), each step says what
it needs from calibration and compresses one weight; the plan and the calibration loop know no
modifier by type, so a new modifier is one class (plus its name in MODIFIERS)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from pydantic import Field

from sparsellm import compress, load_checkpoint
from sparsellm.compression import parse_recipe, rtn_quantize, sparsegpt_prune
from sparsellm.compression.calibration import compress_weight
from sparsellm.compression.modifiers import (
    GPTQ,
    MODIFIERS,
    EmbeddingRows,
    KeepZeros,
    Magnitude,
    Modifier,
    QuantizationArgs,
    RoundToNearest,
    SparseGPT,
)
from sparsellm.compression.plan import (
    PlanContext,
    Planned,
    Pruned,
    PruneStep,
    TensorPlan,
    WeightModule,
    weight_modules,
)
from sparsellm.compression.recipe import build_plan
from sparsellm.compression.sparsegpt import accumulate_hessian, obs_compress
from sparsellm.models.formats import WeightFormat

MODULES = weight_modules(["lm_head.weight"], 2)
LINEAR = WeightModule("model.layers.0.mlp.up_proj", "Linear", 0)
INT8 = QuantizationArgs(num_bits=8)


@dataclass(frozen=True)
class BelowThreshold(PruneStep):
    threshold: float

    def prune(self, w, h, quant):
        keep = np.abs(w) >= self.threshold
        return Pruned(np.where(keep, w, 0).astype(np.float32), keep, "unstructured")


class ThresholdPruningModifier(Modifier):
    """A new modifier, written as a user would: zero every |w| below a threshold."""

    threshold: float = Field(gt=0)
    targets: str | list[str] = "Linear"
    ignore: list[str] = Field(default_factory=list)

    def plan(self, ctx: PlanContext) -> list[Planned]:
        return [Planned(module, BelowThreshold(self.threshold), rank=1)
                for module, _ in ctx.select(self.targets, self.ignore)]


def test_a_new_modifier_is_one_class(tiny_model, calib_texts, tmp_path, monkeypatch):
    monkeypatch.setitem(MODIFIERS, "ThresholdPruningModifier", ThresholdPruningModifier)
    recipe = ("ThresholdPruningModifier: {threshold: 0.1, ignore: [lm_head]}\n"
              "QuantizationModifier: {scheme: W8A16, ignore: [lm_head]}\n")
    compress(tiny_model, calib_texts, recipe, tmp_path / "o", 2, 16, progress=False)
    source, out = load_checkpoint(tiny_model), load_checkpoint(tmp_path / "o")
    name = "model.layers.0.mlp.up_proj.weight"
    assert out.weight_formats[name].name == "sparse_int8"  # pruned, then quantized with its mask
    w, q = source.tensors[name], out.tensors[name]
    kept = np.abs(w) >= 0.1
    np.testing.assert_array_equal(q != 0, kept)
    assert np.abs(q - w)[kept].max() <= np.abs(w).max() / 127  # within one int8 step
    assert "lm_head.weight" not in out.weight_formats


def test_a_later_pruning_wins_and_keeping_zeros_replaces_no_pruning():
    plan = build_plan(parse_recipe(
        "MagnitudePruningModifier: {sparsity: 0.3, targets: [model.layers.0.mlp.up_proj]}\n"
        "SparseGPTModifier: {sparsity: 0.6, targets: [Linear]}\n"
        "ConstantPruningModifier: {targets: [Linear]}\n"), MODULES)
    # the later SparseGPTModifier wins even where the magnitude target was more specific
    assert {type(t.prune) for t in plan.tensors.values()} == {SparseGPT}
    plan = build_plan(parse_recipe(
        "ConstantPruningModifier: {targets: [Linear]}\n"
        "MagnitudePruningModifier: {sparsity: 0.3, targets: ['re:.*up_proj$']}\n"), MODULES)
    assert {n: type(t.prune) for n, t in plan.tensors.items() if "mlp" in n} == {
        f"model.layers.{i}.mlp.{p}_proj": Magnitude if p == "up" else KeepZeros
        for i in range(2) for p in ("gate", "up", "down")}


def test_keeping_zeros_leaves_the_embedding_to_its_quantization():
    plan = build_plan(parse_recipe(
        "ConstantPruningModifier: {targets: [Linear, Embedding]}\n"
        "QuantizationModifier: {scheme: W8A16, targets: [Embedding]}\n"), MODULES)
    emb = plan.tensors["model.embed_tokens"]
    assert emb.prune is None and emb.quant == EmbeddingRows(QuantizationArgs(
        num_bits=8, symmetric=True, strategy="channel", dynamic=False))


def test_steps_that_need_the_hessian_say_so():
    w = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    for plan in (TensorPlan(LINEAR, prune=SparseGPT(0.5)), TensorPlan(LINEAR, quant=GPTQ(INT8))):
        assert plan.needs_hessian
        with pytest.raises(ValueError) as info:
            compress_weight(w, None, plan)
        assert str(info.value) == (f"model.layers.0.mlp.up_proj: {type(plan.steps[0]).__name__}"
                                   " needs calibration inputs")
    plan = TensorPlan(LINEAR, Magnitude(0.5), RoundToNearest(INT8))
    assert not plan.needs_hessian and plan.steps == [plan.prune, plan.quant]
    out = compress_weight(w, None, plan)
    assert out.format.name == "sparse_int8" and out.quantized is not None
    assert (out.weight[~out.keep] == 0).all() and (~out.keep).mean() == 0.5


def test_sparsegpt_quantizes_jointly_unless_told_not_to():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    h, _ = accumulate_hessian(None, rng.standard_normal((256, 32)), 0)
    quant = RoundToNearest(INT8)
    joint = compress_weight(w, h, TensorPlan(LINEAR, SparseGPT(0.5), quant))
    res = obs_compress(w, h, sparsity=0.5, quant=WeightFormat(bits=8))
    np.testing.assert_array_equal(joint.quantized.q, res.q)
    np.testing.assert_array_equal(joint.keep, res.mask)
    np.testing.assert_array_equal(joint.weight, joint.quantized.dequantize())
    assert joint.format == joint.quantized.format == WeightFormat(bits=8, sparsity="unstructured")
    apart = compress_weight(w, h, TensorPlan(LINEAR, SparseGPT(0.5, joint_quant=False), quant))
    pruned, keep = sparsegpt_prune(w, h, 0.5)
    np.testing.assert_array_equal(apart.quantized.q,
                                  rtn_quantize(pruned, WeightFormat(bits=8), mask=keep).q)
    assert apart.format == joint.format


def test_an_embedding_is_quantized_row_by_row_whatever_the_groups():
    table = np.random.default_rng(2).standard_normal((40, 64)).astype(np.float32)
    module = WeightModule("model.embed_tokens", "Embedding", None)
    plan = TensorPlan(module, quant=EmbeddingRows(QuantizationArgs(num_bits=4, group_size=32)))
    out = compress_weight(table, None, plan)
    assert out.format == WeightFormat(bits=4) and out.quantized.scale.shape == (40, 1)
    assert out.keep is None
