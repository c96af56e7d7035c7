"""Recipe parsing (SparseML and llm-compressor forms), strictness and clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparsellm.compression import (
    GPTQModifier,
    RecipeError,
    SparseGPTModifier,
    parse_recipe,
)
from sparsellm.compression.modifiers import (
    GPTQ,
    EmbeddingRows,
    KeepZeros,
    Magnitude,
    RoundToNearest,
    SparseGPT,
)
from sparsellm.compression.plan import match_target, resolve_targets, weight_modules
from sparsellm.compression.recipe import build_plan

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
    assert emb.prune is None and isinstance(emb.quant, EmbeddingRows)
    assert emb.quant.weight_format(64).symmetric is False
    assert emb.quant.input_activations is None
    q = plan.tensors["model.layers.1.mlp.down_proj"]
    assert isinstance(q.prune, SparseGPT) and q.prune.sparsity == 0.5 and q.prune.joint_quant
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
    assert isinstance(t.quant, GPTQ)
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
    assert isinstance(plan.tensors["model.layers.0.mlp.up_proj"].prune, Magnitude)
    assert "lm_head" not in plan.tensors  # default targets are the decoder layers


def test_recipe_from_file(tmp_path, seed_recipe):
    path = tmp_path / "recipe.yaml"
    path.write_text(seed_recipe)
    assert len(parse_recipe(str(path)).modifiers) == 2
    with pytest.raises(FileNotFoundError, match="does not exist"):
        parse_recipe(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize("data, match", [
    (b"SparseGPTModifier: {sparsity: 1.5}", r"sparsity: Input should be less than 1"),
    (b"SparseGPTModifier: {sparsity: 0.5, 7: 1}", r"setting names are strings; got 7"),
    (b"SparseGPTModifier: {sparsity: 0.5\xff}", r"not UTF-8 text \(at byte 33\)"),
    (b"SparseGPTModifier: [", r"recipe is not valid YAML"),
])
def test_recipe_file_errors_name_the_file(tmp_path, data, match):
    """(A setting name that is not a string was a TypeError from the modifier's constructor,
    bytes that are not UTF-8 a UnicodeDecodeError; neither named the file.)"""
    path = tmp_path / "recipe.yaml"
    path.write_bytes(data)
    with pytest.raises(RecipeError, match=f"^{re.escape(str(path))}: .*{match}"):
        parse_recipe(path)


@pytest.mark.parametrize("targets", ["targets: ['re:(']", "targets: [Linear], ignore: ['re:[']"])
def test_plan_refuses_a_target_that_is_not_a_regular_expression(tmp_path, targets):
    """(It was re.error from the plan, which named neither the recipe nor the target.)"""
    path = tmp_path / "recipe.yaml"
    path.write_text(f"SparseGPTModifier: {{sparsity: 0.5, {targets}}}\n")
    with pytest.raises(RecipeError, match=rf"^{re.escape(str(path))}: SparseGPTModifier: "
                                          r"'re:[(\[]' is not a regular expression"):
        build_plan(parse_recipe(path), MODULES)


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
    assert isinstance(t.prune, KeepZeros) and isinstance(t.quant, GPTQ)
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


# ---- every branch and message (found by mutation testing: scripts/mutation.sh) -----------------
ACCEPTED_MODIFIERS = ("SparseGPTModifier, GPTQModifier, QuantizationModifier, "
                      "MagnitudePruningModifier, ConstantPruningModifier")
ARGS_KEYS = ("num_bits, type, symmetric, group_size, strategy, dynamic, actorder, observer, "
             "observer_kwargs, block_structure")


def recipe_error(recipe, modules=None) -> str:
    with pytest.raises(RecipeError) as info:
        plan = parse_recipe(recipe)
        if modules is not None:
            build_plan(plan, modules)
    return str(info.value)


def test_modifier_objects_dump_to_one_oneshot_stage_in_their_order():
    recipe = parse_recipe([SparseGPTModifier(sparsity=0.5, targets=["Linear"]),
                           GPTQModifier(scheme="W8A8")])
    assert recipe.source is None
    assert recipe.to_yaml() == (
        "compression_stage:\n  run_type: oneshot\n  oneshot_modifiers:\n"
        "    SparseGPTModifier:\n      sparsity: 0.5\n      targets:\n      - Linear\n"
        "    GPTQModifier:\n      scheme: W8A8\n")  # only the keys that were set
    again = parse_recipe(recipe.to_yaml())
    assert [m for _, m in again.modifiers] == [m for _, m in recipe.modifiers]
    single = parse_recipe(SparseGPTModifier(sparsity=0.3))  # one modifier, not in a list
    assert [(w, type(m).__name__) for w, m in single.modifiers] == [
        ("modifiers[0]", "SparseGPTModifier")]


def test_recipe_source_is_kept_as_given():
    text = "SparseGPTModifier: {sparsity: 0.5}"
    assert parse_recipe(text).to_yaml() == text + "\n"
    assert parse_recipe(text + "\n").to_yaml() == text + "\n"
    data = {"SparseGPTModifier": {"sparsity": 0.5}, "GPTQModifier": {"scheme": "W8A16"}}
    assert parse_recipe(data).to_yaml() == (
        "SparseGPTModifier:\n  sparsity: 0.5\nGPTQModifier:\n  scheme: W8A16\n")


def test_recipe_files_and_strings_that_look_like_paths(tmp_path):
    path = tmp_path / "r.yml"
    path.write_text("SparseGPTModifier: {sparsity: 0.5}\n")
    assert len(parse_recipe(str(path)).modifiers) == 1
    assert len(parse_recipe(path).modifiers) == 1
    # more than one line is YAML, even when it ends like a file name
    assert len(parse_recipe("SparseGPTModifier: {sparsity: 0.5}\n# see recipe.yaml").modifiers) \
        == 1
    missing = tmp_path / "missing.yml"
    with pytest.raises(FileNotFoundError) as info:
        parse_recipe(str(missing))
    assert str(info.value) == f"recipe file {str(missing)!r} does not exist"
    assert recipe_error("sparse50") == "recipe 'sparse50' is neither a YAML mapping nor a file"
    assert recipe_error("- 1\n- 2") == (
        "a recipe must be a mapping of stages (or modifiers), got list")
    assert recipe_error("a: [1,").startswith("recipe is not valid YAML: while parsing")
    assert recipe_error([1]) == (
        f"recipe item 0 is a int, not a modifier; accepted modifiers: {ACCEPTED_MODIFIERS}")


def test_recipe_keys_stages_and_where_each_modifier_came_from():
    recipe = parse_recipe(
        "version: 1.1\n"
        "SparseGPTModifier: {sparsity: 0.5}\n"
        "prune:\n  pruning_modifiers:\n    MagnitudePruningModifier: {final_sparsity: 0.3}\n"
        "quant_stage:\n  GPTQModifier: {scheme: W8A16}\n"
        "ConstantPruningModifier:\n")  # null settings: the defaults
    assert [(w, type(m).__name__) for w, m in recipe.modifiers] == [
        ("SparseGPTModifier", "SparseGPTModifier"),
        ("prune.pruning_modifiers.MagnitudePruningModifier", "MagnitudePruningModifier"),
        ("quant_stage.GPTQModifier", "GPTQModifier"),
        ("ConstantPruningModifier", "ConstantPruningModifier")]
    assert recipe_error("version: 1.1\n") == "the recipe has no modifiers"
    assert recipe_error("FancyModifier: {}") == (
        "unknown recipe key 'FancyModifier': expected a stage (a mapping with `*_modifiers`, "
        "e.g. `compression_stage: {run_type: oneshot, oneshot_modifiers: {...}}`) or a modifier "
        f"({ACCEPTED_MODIFIERS})")


@pytest.mark.parametrize("text,message", [
    ("s_stage:\n  run_type: train\n  m_modifiers: {SparseGPTModifier: {sparsity: 0.5}}",
     "s_stage.run_type: run_type 'train' is not supported; accepted: oneshot (sparsellm "
     "compresses one-shot)"),
    ("s_stage:\n  m_modifiers: [SparseGPTModifier]",
     "s_stage.m_modifiers must map modifier names to their settings"),
    ("s_stage:\n  foo: 1",
     "s_stage.foo: unknown stage key; accepted: run_type, <group>_modifiers (e.g. "
     "oneshot_modifiers, sparsity_modifiers)"),
    ("s_stage:\n  m_modifiers:\n    FancyModifier: {}",
     f"s_stage.m_modifiers.FancyModifier: unknown modifier 'FancyModifier'; accepted: "
     f"{ACCEPTED_MODIFIERS}"),
    ("s_stage:\n  m_modifiers:\n    SparseGPTModifier: {sparsity: 1.5}",
     "s_stage.m_modifiers.SparseGPTModifier.sparsity: Input should be less than 1 (got 1.5)"),
    ("s_stage:\n  SparseGPTModifier: {sparsity: 1.5}",
     "s_stage.SparseGPTModifier.sparsity: Input should be less than 1 (got 1.5)"),
    ("SparseGPTModifier: 5", "SparseGPTModifier: settings must be a mapping, got 5"),
    ("SparseGPTModifier: {sparsity: 1.5, mask_structure: '4:2'}",
     "SparseGPTModifier.sparsity: Input should be less than 1 (got 1.5)\n"
     "SparseGPTModifier.mask_structure: Value error, mask_structure '4:2' needs 0 < N < M "
     "(got '4:2')"),
    ("GPTQModifier: {config_groups: {g: {weights: {num_bits: 8, bogus: 1}, bogus2: 1}}}",
     f"GPTQModifier.config_groups.g.weights.bogus: unknown key; accepted: {ARGS_KEYS}\n"
     "GPTQModifier.config_groups.g.bogus2: unknown key; accepted: targets, weights, "
     "input_activations, output_activations, format"),
    ("QuantizationModifier: {config_groups: {g: {input_activations: {bogus: 1}}}}",
     f"QuantizationModifier.config_groups.g.input_activations.bogus: unknown key; accepted: "
     f"{ARGS_KEYS}"),
    ("QuantizationModifier: {scheme_overrides: {Linear: {bogus: 1, weights: {bogus: 2}}}}",
     f"QuantizationModifier.scheme_overrides.Linear.weights.bogus: unknown key; accepted: "
     f"{ARGS_KEYS}\nQuantizationModifier.scheme_overrides.Linear.bogus: unknown key; "
     "accepted: weights, input_activations, output_activations"),
    ("MagnitudePruningModifier: {}",  # an error of the whole modifier: no key to name
     "MagnitudePruningModifier: Value error, MagnitudePruningModifier needs `sparsity` (or "
     "`final_sparsity`) or an N:M `mask_structure` (got {})"),
    ("ConstantPruningModifier: {bogus: 1}",
     "ConstantPruningModifier.bogus: unknown key; accepted: index, group, start, end, update, "
     "targets, ignore, params, leave_enabled"),
])
def test_recipe_errors_name_the_place_the_key_and_what_is_accepted(text, message):
    assert recipe_error(text) == message


def test_weight_modules_in_execution_order():
    def names(mods):
        return [(m.name, m.kind, m.layer) for m in mods]

    layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
    assert names(weight_modules(["lm_head.weight"], 1, gated_mlp=False)) == [
        ("model.embed_tokens", "Embedding", None),
        *[(f"model.layers.0.{s}", "Linear", 0) for s in layer + ["mlp.up_proj",
                                                                  "mlp.down_proj"]],
        ("lm_head", "Linear", None)]
    assert names(weight_modules([], 2))[1:] == [
        (f"model.layers.{i}.{s}", "Linear", i) for i in range(2)
        for s in layer + ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]]
    assert weight_modules([], 1)[1].weight == "model.layers.0.self_attn.q_proj.weight"


MODS11 = weight_modules(["lm_head.weight"], 11)


@pytest.mark.parametrize("target,selected,specificity", [
    ("Linear", [m.name for m in MODS11 if m.kind == "Linear"], 0),
    ("Embedding", ["model.embed_tokens"], 0),
    ("LlamaDecoderLayer", [m.name for m in MODS11 if m.layer is not None], 0),
    ("GPT2Block", [m.name for m in MODS11 if m.layer is not None], 0),
    ("LlamaAttention", [m.name for m in MODS11 if ".self_attn." in m.name], 0),
    ("LlamaMLP", [m.name for m in MODS11 if ".mlp." in m.name], 0),
    ("model.layers.1", [m.name for m in MODS11 if m.layer == 1], 2),  # not model.layers.10
    ("model.layers.1.mlp", [f"model.layers.1.mlp.{p}_proj" for p in ("gate", "up", "down")], 2),
    ("lm_head", ["lm_head"], 2),
    (r"re:model\.layers\.1$", [m.name for m in MODS11 if m.layer == 1], 1),
    (r"re:.*\.1\.self_attn$", [f"model.layers.1.self_attn.{p}_proj" for p in "qkvo"], 1),
    (r"re:.*down_proj$", [f"model.layers.{i}.mlp.down_proj" for i in range(11)], 1),
    (r"re:model\.layers$", [], 1),  # a container above the decoder layers selects nothing
    ("Conv2d", [], 2),
    ("LlamaRotaryAttention", [], 2),  # rotary classes hold no weights
])
def test_match_target(target, selected, specificity):
    found, spec = match_target(target, MODS11)
    assert [m.name for m in found] == selected and spec == specificity


def test_resolve_targets_specificity_notes_and_errors():
    notes: list[str] = []
    got = resolve_targets(["model.layers.0.mlp.up_proj", "LlamaRMSNorm", "Linear"], ["lm_head"],
                          MODULES, "Q", notes)
    assert got == {m.name: 2 if m.name == "model.layers.0.mlp.up_proj" else 0
                   for m in MODULES if m.kind == "Linear" and m.name != "lm_head"}
    assert notes == ["Q: target 'LlamaRMSNorm' holds no weights; nothing to compress"]
    assert resolve_targets("Embedding", [], MODULES, "Q", []) == {"model.embed_tokens": 0}
    # an ignore entry that matches nothing is noted, unless it names a tied lm_head
    untied = weight_modules([], 1)
    for ignore in ("lm_head", "re:.*lm_head"):
        notes = []
        resolve_targets("Linear", [ignore], untied, "Q", notes)
        assert notes == [f"Q: ignore entry {ignore!r} has no effect (it matches no weight)"]
        notes = []
        resolve_targets("Linear", [ignore], untied, "Q", notes, tied_embeddings=True)
        assert notes == []
    with pytest.raises(RecipeError) as info:
        resolve_targets(["Conv2d"], [], MODULES, "Q", [])
    assert str(info.value) == (
        "Q: target 'Conv2d' matches no weight of this model; accepted: Linear, Embedding, a "
        "decoder-layer class (LlamaDecoderLayer), a module name (model.layers.0.mlp.down_proj, "
        "lm_head) or `re:<regex>` on module names")


def quant_of(plan, name="model.layers.0.mlp.up_proj"):
    q = plan.tensors[name].quant
    return (type(q), q.weights.num_bits, q.weights.group_size, q.weights.strategy,
            q.input_activations)


def test_plan_quantization_settings_per_modifier_and_kind():
    from sparsellm.compression.modifiers import QuantizationArgs

    a8 = QuantizationArgs(num_bits=8, symmetric=True, strategy="token", dynamic=True)
    plan = build_plan(parse_recipe(
        "GPTQModifier: {scheme: W8A8, targets: [Linear, Embedding], block_size: 32, "
        "dampening_frac: 0.05, actorder: static}"), MODULES)
    assert quant_of(plan) == (GPTQ, 8, None, "channel", a8)
    gptq = plan.tensors["model.layers.0.mlp.up_proj"].quant
    assert (gptq.blocksize, gptq.percdamp, gptq.actorder) == (32, 0.05, True)
    # the embedding is quantized round-to-nearest, row by row, without int8 activations
    assert quant_of(plan, "model.embed_tokens") == (EmbeddingRows, 8, None, "channel", None)
    plan = build_plan(parse_recipe("QuantizationModifier: {scheme: W4A16}"), MODULES)
    assert quant_of(plan) == (RoundToNearest, 4, 128, "group", None)
    assert plan.tensors["model.layers.0.mlp.up_proj"].module == MODULES[6]
    # channel strategy: no group size, whatever group_size says
    plan = build_plan(parse_recipe("QuantizationModifier: {config_groups: {g: {weights: "
                                   "{num_bits: 8, strategy: channel, group_size: 32}}}}"),
                      MODULES)
    assert plan.tensors["model.layers.0.mlp.up_proj"].quant.weight_format(64).group_size is None


def test_plan_later_and_more_specific_schemes_win():
    two = ("QuantizationModifier:\n  config_groups:\n"
           "    a: {targets: [{first}], weights: {num_bits: 8}}\n"
           "    b: {targets: [{second}], weights: {num_bits: 4, group_size: 32}}\n")
    bits = {}
    for first, second in [("Linear", "Linear"), ("Linear", "re:.*up_proj$"),
                          ("re:.*up_proj$", "Linear"), ("model.layers.0.mlp.up_proj",
                                                        "re:.*up_proj$")]:
        recipe = two.replace("{first}", first).replace("{second}", second)
        plan = build_plan(parse_recipe(recipe), MODULES)
        bits[(first, second)] = quant_of(plan)[1]
    assert bits == {("Linear", "Linear"): 4,  # same specificity: the later one
                    ("Linear", "re:.*up_proj$"): 4, ("re:.*up_proj$", "Linear"): 8,
                    ("model.layers.0.mlp.up_proj", "re:.*up_proj$"): 8}
    # a group without weights (activations only) is skipped, not the end of the groups
    plan = build_plan(parse_recipe(
        "QuantizationModifier:\n  config_groups:\n"
        "    a: {targets: [Linear], input_activations: {num_bits: 8, strategy: token, "
        "dynamic: true}}\n    b: {targets: [Linear], weights: {num_bits: 4, group_size: 32}}\n"),
        MODULES)
    assert quant_of(plan)[1] == 4


@pytest.mark.parametrize("acts", ["{num_bits: 8, strategy: token}",
                                  "{num_bits: 8, strategy: tensor, dynamic: true}"])
def test_plan_static_activations_become_dynamic_per_token(acts):
    from sparsellm.compression.modifiers import QuantizationArgs

    plan = build_plan(parse_recipe(
        "QuantizationModifier:\n  config_groups:\n    g:\n      targets: [Linear]\n"
        f"      weights: {{num_bits: 8}}\n      input_activations: {acts}\n"), MODULES)
    assert quant_of(plan)[4] == QuantizationArgs(num_bits=8, symmetric=True, strategy="token",
                                                 dynamic=True)
    strategy = "token" if "token" in acts else "tensor"
    assert plan.notes == [f"QuantizationModifier: static {strategy} int8 activations are stored "
                          "as dynamic per-token int8 (no activation calibration)"]


def test_plan_pruning_settings_and_notes():
    plan = build_plan(parse_recipe(
        "MagnitudePruningModifier: {final_sparsity: 0.4, mask_structure: '2:4'}\n"
        "GPTQModifier: {scheme: W8A16}"), MODULES)
    t = plan.tensors["model.layers.0.mlp.up_proj"]
    assert t.prune == Magnitude(sparsity=0.5, prunen=2, prunem=4)  # nothing else to set
    assert t.prune.structure == "2:4" and plan.notes == []  # no joint solve to skip
    t = build_plan(parse_recipe(
        "SparseGPTModifier: {sparsity: 0.5, block_size: 16, dampening_frac: 0.1}"),
        MODULES).tensors["model.layers.1.self_attn.o_proj"]
    assert t.prune == SparseGPT(sparsity=0.5, blocksize=16, percdamp=0.1, joint_quant=True)
    assert t.prune.structure == "unstructured" and t.quant is None
    alone = build_plan(parse_recipe("SparseGPTModifier: {sparsity: 0.5, quantize: false}"),
                       MODULES)
    assert alone.notes == []  # nothing quantizes it: nothing to note
    both = build_plan(parse_recipe("SparseGPTModifier: {sparsity: 0.5, quantize: false}\n"
                                   "QuantizationModifier: {scheme: W8A16, ignore: [lm_head]}"),
                      MODULES)
    assert both.notes == [f"model.layers.{i}.{s}: pruned by SparseGPT, then quantized "
                          "separately (quantize: false)"
                          for i in range(2) for s in ("self_attn.q_proj", "self_attn.k_proj",
                                                      "self_attn.v_proj", "self_attn.o_proj",
                                                      "mlp.gate_proj", "mlp.up_proj",
                                                      "mlp.down_proj")]
    plan = build_plan(parse_recipe(r"ConstantPruningModifier: {params: ['re:.*q_proj$']}"),
                      MODULES)
    assert list(plan.tensors) == ["model.layers.0.self_attn.q_proj",
                                  "model.layers.1.self_attn.q_proj"]
    assert isinstance(plan.tensors["model.layers.0.self_attn.q_proj"].prune, KeepZeros)


@pytest.mark.parametrize("text,message", [
    ("QuantizationModifier: {config_groups: {g: {weights: {num_bits: 2}}}}",
     "QuantizationModifier: weights num_bits 2 is not supported; accepted: 4, 8"),
    ("QuantizationModifier: {config_groups: {g: {weights: {num_bits: 8}, input_activations: "
     "{num_bits: 4, strategy: token, dynamic: true}}}}",
     "QuantizationModifier: input_activations num_bits 4 is not supported; accepted: 8 (or "
     "null)"),
    ("SparseGPTModifier: {sparsity: 0.5, targets: [Embedding]}",
     "SparseGPTModifier: model.embed_tokens is an embedding; pruning applies to linear layers "
     "(add it to `ignore`)"),
    ("MagnitudePruningModifier: {sparsity: 0.5, targets: [Conv2d]}",
     "MagnitudePruningModifier: target 'Conv2d' matches no weight of this model; accepted: "
     "Linear, Embedding, a decoder-layer class (LlamaDecoderLayer), a module name "
     "(model.layers.0.mlp.down_proj, lm_head) or `re:<regex>` on module names"),
    ("ConstantPruningModifier: {targets: [Conv2d]}",
     "ConstantPruningModifier: target 'Conv2d' matches no weight of this model; accepted: "
     "Linear, Embedding, a decoder-layer class (LlamaDecoderLayer), a module name "
     "(model.layers.0.mlp.down_proj, lm_head) or `re:<regex>` on module names"),
    ("SparseGPTModifier: {sparsity: 0.5, targets: [Linear], ignore: [Linear]}",
     "the recipe selects no weights to compress"),
])
def test_plan_errors(text, message):
    assert recipe_error(text, MODULES) == message


def test_plan_notes_default_to_untied_embeddings():
    recipe = parse_recipe("QuantizationModifier: {scheme: W8A16, ignore: [lm_head]}\n"
                          "SparseGPTModifier: {sparsity: 0.5, ignore: [lm_head]}\n"
                          "ConstantPruningModifier: {targets: [Linear], ignore: [lm_head]}")
    modules = weight_modules([], 1)
    note = "{}: ignore entry 'lm_head' has no effect (it matches no weight)"
    assert build_plan(recipe, modules).notes == [
        note.format(m) for m in ("QuantizationModifier", "SparseGPTModifier",
                                 "ConstantPruningModifier")]
    assert build_plan(recipe, modules, tied_embeddings=True).notes == []
