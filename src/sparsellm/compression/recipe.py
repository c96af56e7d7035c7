"""Recipes: YAML (SparseML or llm-compressor form), a dict, or modifier objects -> a strict list
of modifiers -> a per-tensor compression plan for one model.

    compression_stage:                       # a stage: any key holding `*_modifiers`
      run_type: oneshot
      oneshot_modifiers:
        SparseGPTModifier: {sparsity: 0.5, targets: ['re:model.layers.\\d*$']}

All stages of a recipe are applied in one calibrated pass (one-shot); a SparseGPTModifier and a
quantization modifier on the same weights are solved jointly (prune + quantize with OBS updates).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .modifiers import (
    MODIFIERS,
    Modifier,
    QuantizationArgs,
    QuantizationScheme,
    SchemeOverride,
)
from .plan import (
    SLOTS,
    Plan,
    PlanContext,
    Planned,
    RecipeError,
    TensorPlan,
    WeightModule,
)


@dataclass
class Recipe:
    modifiers: list[tuple[str, Modifier]]  # (where it was defined, modifier)
    source: str | None = None  # the YAML as given, saved verbatim as recipe.yaml
    path: Path | None = None  # the file it was read from: errors name it

    def to_yaml(self) -> str:
        """The recipe as given, or one oneshot stage holding the modifier objects."""
        if self.source is not None:
            return self.source
        mods = {}
        for _, m in self.modifiers:
            mods[type(m).__name__] = m.model_dump(exclude_unset=True, mode="json")
        return yaml.safe_dump({"compression_stage": {"run_type": "oneshot",
                                                     "oneshot_modifiers": mods}},
                              sort_keys=False)


RUN_TYPES = ("oneshot",)


def parse_recipe(recipe: str | Path | dict | BaseModel | Sequence[BaseModel] | Recipe) -> Recipe:
    """A recipe from a YAML path, a YAML string, a dict, a modifier or a list of modifiers."""
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, BaseModel):
        recipe = [recipe]
    if isinstance(recipe, list | tuple):
        mods = []
        for i, m in enumerate(recipe):
            if not isinstance(m, Modifier):
                raise RecipeError(f"recipe item {i} is a {type(m).__name__}, not a modifier; "
                                  f"accepted modifiers: {', '.join(MODIFIERS)}")
            mods.append((f"modifiers[{i}]", m))
        return Recipe(mods)
    if isinstance(recipe, Path) or (isinstance(recipe, str) and "\n" not in recipe
                                    and recipe.strip().endswith((".yaml", ".yml"))):
        return _parse_file(Path(recipe).expanduser())
    if isinstance(recipe, str):
        return _parse_text(recipe)
    return _parse_data(recipe)


def _parse_text(text: str) -> Recipe:
    source = text if text.endswith("\n") else text + "\n"
    try:
        recipe = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RecipeError(f"recipe is not valid YAML: {e}") from e
    if isinstance(recipe, str) and Path(recipe).suffix == "":
        raise RecipeError(f"recipe {recipe!r} is neither a YAML mapping nor a file")
    return _parse_data(recipe, source)


def _parse_data(recipe: object, source: str | None = None) -> Recipe:
    if not isinstance(recipe, dict):
        raise RecipeError("a recipe must be a mapping of stages (or modifiers), got "
                          f"{type(recipe).__name__}")
    if source is None:
        source = yaml.safe_dump(recipe, sort_keys=False)
    return Recipe(_parse_mapping(recipe), source)


def _parse_file(path: Path) -> Recipe:
    """A recipe file; its errors name it."""
    if not path.is_file():
        raise FileNotFoundError(f"recipe file {str(path)!r} does not exist")
    data = path.read_bytes()
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise RecipeError(f"{path}: not UTF-8 text (at byte {e.start})") from None
    try:
        recipe = _parse_text(text)
    except RecipeError as e:
        raise RecipeError(f"{path}: {e}") from None
    recipe.path = path
    return recipe


def _parse_mapping(data: dict) -> list[tuple[str, Modifier]]:
    mods: list[tuple[str, Modifier]] = []
    for key, value in data.items():
        if key in MODIFIERS:
            mods.append((key, _build(key, value, key)))
        elif key == "version":
            continue
        elif isinstance(value, dict) and (str(key).endswith("stage") or any(
                str(k).endswith("modifiers") for k in value)):
            mods += _parse_stage(str(key), value)
        else:
            raise RecipeError(
                f"unknown recipe key {key!r}: expected a stage (a mapping with `*_modifiers`, "
                f"e.g. `compression_stage: {{run_type: oneshot, oneshot_modifiers: {{...}}}}`) "
                f"or a modifier ({', '.join(MODIFIERS)})")
    if not mods:
        raise RecipeError("the recipe has no modifiers")
    return mods


def _parse_stage(name: str, stage: dict) -> list[tuple[str, Modifier]]:
    mods = []
    for key, value in stage.items():
        where = f"{name}.{key}"
        if key == "run_type":
            if value not in RUN_TYPES:
                raise RecipeError(f"{where}: run_type {value!r} is not supported; accepted: "
                                  f"{', '.join(RUN_TYPES)} (sparsellm compresses one-shot)")
        elif str(key).endswith("modifiers"):
            if not isinstance(value, dict):
                raise RecipeError(f"{where} must map modifier names to their settings")
            for mod_name, args in value.items():
                mods.append((f"{where}.{mod_name}", _build(mod_name, args, f"{where}.{mod_name}")))
        elif key in MODIFIERS:
            mods.append((f"{name}.{key}", _build(key, value, f"{name}.{key}")))
        else:
            raise RecipeError(f"{where}: unknown stage key; accepted: run_type, "
                              "<group>_modifiers (e.g. oneshot_modifiers, sparsity_modifiers)")
    return mods


def _build(name: str, args: Any, where: str) -> Modifier:
    if name not in MODIFIERS:
        raise RecipeError(f"{where}: unknown modifier {name!r}; accepted: {', '.join(MODIFIERS)}")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise RecipeError(f"{where}: settings must be a mapping, got {args!r}")
    odd = [k for k in args if not isinstance(k, str)]
    if odd:
        raise RecipeError(f"{where}: setting names are strings; got {odd[0]!r}")
    try:
        return MODIFIERS[name](**args)
    except ValidationError as e:
        raise RecipeError(_explain(e, where, MODIFIERS[name])) from None
    except ValueError as e:
        raise RecipeError(f"{where}: {e}") from None


def _explain(e: ValidationError, where: str, cls: type[BaseModel]) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            accepted = ", ".join(_nested_model(cls, err["loc"][:-1]).model_fields)
            lines.append(f"{where}.{loc}: unknown key; accepted: {accepted}")
        else:
            got = err.get("input")
            lines.append(f"{where}{'.' + loc if loc else ''}: {err['msg']} (got {got!r})")
    return "\n".join(lines)


def _nested_model(cls: type[BaseModel], path: tuple) -> type[BaseModel]:
    """The pydantic model at `path` inside cls (for naming the keys it accepts)."""
    if not path:
        return cls
    if path[0] in ("weights", "input_activations"):
        return QuantizationArgs
    if path[0] == "config_groups":
        return _nested_model(QuantizationScheme, path[2:])
    if path[0] == "scheme_overrides":
        return _nested_model(SchemeOverride, path[2:])
    return cls


# ---- plan ---------------------------------------------------------------------------------------
def build_plan(recipe: Recipe, modules: Sequence[WeightModule],
               tied_embeddings: bool = False) -> Plan:
    """Which steps compress each weight: every modifier plans its own (`Modifier.plan`); per
    weight and slot (pruning, quantization) the later step wins unless the earlier one ranks
    higher. Errors name the modifier and key; notes say what a recipe asks for that has no
    effect on this model. Every stage of a recipe runs in the same calibrated one-shot pass,
    layer by layer. The errors of a recipe read from a file name it."""
    try:
        return _build_plan(recipe, modules, tied_embeddings)
    except RecipeError as e:
        if recipe.path is None:
            raise
        raise RecipeError(f"{recipe.path}: {e}") from None


def _build_plan(recipe: Recipe, modules: Sequence[WeightModule],
                tied_embeddings: bool) -> Plan:
    notes: list[str] = []
    chosen: dict[tuple[str, str], Planned] = {}
    for where, mod in recipe.modifiers:
        for planned in mod.plan(PlanContext(modules, where, notes, tied_embeddings)):
            key = (planned.module.name, planned.step.slot)
            if key not in chosen or planned.rank >= chosen[key].rank:
                chosen[key] = planned
    plans = {}
    for m in modules:
        steps = {slot: chosen[m.name, slot].step for slot in SLOTS if (m.name, slot) in chosen}
        if steps:
            tensor = plans[m.name] = TensorPlan(m, **steps)
            notes += [note for step in tensor.steps if (note := step.note(tensor))]
    if not plans:
        raise RecipeError("the recipe selects no weights to compress")
    return Plan(plans, list(dict.fromkeys(notes)))
