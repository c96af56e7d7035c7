"""Recipe parsing (SparseML and llm-compressor forms), strictness and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparsellm.compression import (
    GPTQModifier,
    RecipeError,
    SparseGPTModifier,
    parse_recipe,
)
from sparsellm.compression.recipe import build_plan, weight_modules

LLMC_RECIPE = """
sparsity_stage:
  run_type: oneshot
  sparsity_modifiers:
    SparseGPTModifier:
      sparsity: 0.5
      mask_structure: "2:4"
      block_size: 64
      dampening_frac: 0.02
      targets: [Linear]
      ignore: [lm_head]
quantization_stage:
  run_type: oneshot
  quantization_modifiers:
    GPTQModifier:
      ignore: [lm_head]
      config_groups:
        group_0:
          targets: [Linear]
          weights: {num_bits: 4, type: int, symmetric: false, strategy: group, group_size: 32}
"""

MODULES = weight_modules(["lm_head.weight"], 2)


def test_seed_recipe_parses_and_plans(seed_recipe):
    SEED_RECIPE = seed_recipe
    recipe = parse_recipe(SEED_RECIPE)
    assert [type(m).__name__ for _, m in recipe.modifiers] == ["QuantizationModifier",
                                                               "SparseGPTModifier"]
    plan = build_plan(recipe, weight_modules([], 2), tied_embeddings=True)
    emb = plan.tensors["model.embed_tokens"]
    assert emb.prune is None and emb.quant.weight_format(64).symmetric is False
    assert emb.quant.input_activations is None
    q = plan.tensors["model.layers.1.mlp.down_proj"]
    assert q.prune.method == "sparsegpt" and q.prune.sparsity == 0.5 and q.prune.joint_quant
    fmt = q.quant.weight_format(128)
    assert (fmt.bits, fmt.group_size, fmt.symmetric, fmt.activation_bits) == (8, None, True, 8)
    assert plan.notes == []  # ignoring non-weight classes and post_oneshot_calibration: quiet
    assert recipe.to_yaml().strip() == SEED_RECIPE.strip()


def test_llm_compressor_recipe():
    plan = build_plan(parse_recipe(LLMC_RECIPE), MODULES)
    assert "lm_head" not in plan.tensors and "model.embed_tokens" not in plan.tensors
    t = plan.tensors["model.layers.0.self_attn.q_proj"]
    assert (t.prune.prunen, t.prune.prunem, t.prune.blocksize, t.prune.percdamp) == (2, 4, 64,
                                                                                       0.02)
    assert t.quant.method == "gptq"
    fmt = t.quant.weight_format(64)
    assert (fmt.bits, fmt.group_size, fmt.symmetric) == (4, 32, False)


@pytest.mark.parametrize("scheme,bits,group,sym,act", [
    ("W8A8", 8, None, True, 8), ("W8A16", 8, None, True, None), ("W4A16", 4, 128, True, None),
    ("W4A16_ASYM", 4, 128, False, None),
])
def test_scheme_presets(scheme, bits, group, sym, act):
    plan = build_plan(parse_recipe(f"GPTQModifier: {{scheme: {scheme}, ignore: [lm_head]}}"),
                      MODULES)
    fmt = plan.tensors["model.layers.0.mlp.up_proj"].quant.weight_format(256)
    assert (fmt.bits, fmt.group_size, fmt.symmetric, fmt.activation_bits) == (bits, group,
                                                                              sym, act)
    assert "lm_head" not in plan.tensors


def test_modifier_objects_and_magnitude():
    plan = build_plan(parse_recipe([SparseGPTModifier(sparsity=0.3), GPTQModifier(
        scheme="W8A16", targets=["re:.*down_proj$"])]), MODULES)
    assert plan.tensors["model.layers.0.mlp.down_proj"].quant is not None
    assert plan.tensors["model.layers.0.mlp.up_proj"].quant is None
    plan = build_plan(parse_recipe("MagnitudePruningModifier: {final_sparsity: 0.4}"), MODULES)
    assert plan.tensors["model.layers.0.mlp.up_proj"].prune.method == "magnitude"
    assert "lm_head" not in plan.tensors  # default targets are the decoder layers


def test_recipe_from_file(tmp_path, seed_recipe):
    path = tmp_path / "recipe.yaml"
    path.write_text(seed_recipe)
    assert len(parse_recipe(str(path)).modifiers) == 2
    with pytest.raises(FileNotFoundError, match="does not exist"):
        parse_recipe(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize("text,match", [
    ("SparseGPTModifier: {sparsity: 1.5}", r"sparsity: Input should be less than 1"),
    ("FancyModifier: {}", r"unknown recipe key 'FancyModifier'.*SparseGPTModifier"),
    ("s_stage:\n  m_modifiers:\n    FancyModifier: {}", r"unknown modifier 'FancyModifier'"),
    ("SparseGPTModifier: {sparsity: 0.5, sparsity_level: 3}",
     r"sparsity_level: unknown key; accepted: .*mask_structure"),
    ("GPTQModifier: {config_groups: {g: {weights: {num_bits: 8, bogus: 1}}}}",
     r"bogus: unknown key; accepted: num_bits"),
    ("GPTQModifier: {scheme: W3A16}", r"unknown scheme 'W3A16'; accepted: W8A8"),
    ("SparseGPTModifier: {mask_structure: '4:2'}", r"0 < N < M"),
    ("SparseGPTModifier: {}", r"needs `sparsity`"),
    ("s_stage:\n  run_type: train\n  m_modifiers: {SparseGPTModifier: {sparsity: 0.5}}",
     r"run_type 'train' is not supported"),
    ("- 1\n- 2", r"must be a mapping"),
])
def test_bad_recipes(text, match):
    with pytest.raises(RecipeError, match=match):
        parse_recipe(text)


def test_bad_targets():
    with pytest.raises(RecipeError, match="target 'Conv2d' matches no weight"):
        build_plan(parse_recipe("SparseGPTModifier: {sparsity: 0.5, targets: [Conv2d]}"),
                   MODULES)
    with pytest.raises(RecipeError, match="embedding"):
        build_plan(parse_recipe("SparseGPTModifier: {sparsity: 0.5, targets: [Embedding]}"),
                   MODULES)
    with pytest.raises(RecipeError, match="num_bits 2"):
        build_plan(parse_recipe("QuantizationModifier: {config_groups: {g: {weights: "
                                "{num_bits: 2}}}}"), MODULES)


def test_torch_class_names_are_noted_not_errors():
    recipe = parse_recipe("QuantizationModifier:\n  scheme: W8A8\n  ignore: [lm_head, "
                          "MatMulLeftInput_QK, MatMulRightInput_PV, LlamaRotaryEmbedding, "
                          "model.layers.9]\n  targets: [Linear, LlamaRMSNorm]")
    plan = build_plan(recipe, weight_modules([], 1), tied_embeddings=True)
    assert len(plan.tensors) == 7
    # a target without weights and an ignore entry that matches nothing are noted; ignoring
    # non-weight classes and a tied lm_head (what shared recipes do) is not
    assert plan.notes == [
        "QuantizationModifier: target 'LlamaRMSNorm' holds no weights; nothing to compress",
        "QuantizationModifier: ignore entry 'model.layers.9' has no effect (it matches no "
        "weight)"]


def test_constant_pruning_and_quantize_false():
    plan = build_plan(parse_recipe(
        "ConstantPruningModifier: {targets: [Linear]}\nGPTQModifier: {scheme: W8A16}"), MODULES)
    t = plan.tensors["lm_head"]
    assert t.prune.method == "constant" and t.quant.method == "gptq"
    plan = build_plan(parse_recipe(
        "SparseGPTModifier: {sparsity: 0.5, quantize: false}\n"
        "QuantizationModifier: {scheme: W8A16}"), MODULES)
    assert not plan.tensors["model.layers.0.mlp.up_proj"].prune.joint_quant


EXAMPLE_RECIPES = sorted((Path(__file__).parents[2] / "examples" / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLE_RECIPES, ids=lambda p: p.name)
def test_example_recipes_parse_and_plan_every_linear(path):
    plan = build_plan(parse_recipe(path), weight_modules([], 2), tied_embeddings=True)
    linears = [f"model.layers.{i}.{m}" for i in range(2) for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
    assert all(name in plan.tensors for name in linears)
    assert all(plan.tensors[n].prune or plan.tensors[n].quant for n in linears)
    # notes say what a recipe asks that has no effect: a shipped recipe prints none, run after run
    untied = build_plan(parse_recipe(path), weight_modules(["lm_head.weight"], 2))
    assert plan.notes == untied.notes == []


def test_example_recipes_exist():
    assert len(EXAMPLE_RECIPES) >= 5
