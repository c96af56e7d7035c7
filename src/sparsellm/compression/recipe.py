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

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ..models.formats import WeightFormat
from .modifiers import (
    MODIFIERS,
    ConstantPruningModifier,
    GPTQModifier,
    MagnitudePruningModifier,
    Modifier,
    QuantizationArgs,
    QuantizationModifier,
    QuantizationScheme,
    SchemeOverride,
    SparseGPTModifier,
)
from .quantize import effective_group_size


class RecipeError(ValueError):
    """A recipe that cannot run: the message names the key and what is accepted."""


@dataclass
class Recipe:
    modifiers: list[tuple[str, Modifier]]  # (where it was defined, modifier)
    source: str | None = None  # the YAML as given, saved verbatim as recipe.yaml

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
            if not isinstance(m, tuple(MODIFIERS.values())):
                raise RecipeError(f"recipe item {i} is a {type(m).__name__}, not a modifier; "
                                  f"accepted modifiers: {', '.join(MODIFIERS)}")
            mods.append((f"modifiers[{i}]", m))
        return Recipe(mods)
    if isinstance(recipe, Path) or (isinstance(recipe, str) and "\n" not in recipe
                                    and recipe.strip().endswith((".yaml", ".yml"))):
        path = Path(recipe).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"recipe file {str(recipe)!r} does not exist")
        recipe = path.read_text()
    source = None
    if isinstance(recipe, str):
        source = recipe if recipe.endswith("\n") else recipe + "\n"
        try:
            recipe = yaml.safe_load(recipe)
        except yaml.YAMLError as e:
            raise RecipeError(f"recipe is not valid YAML: {e}") from e
        if isinstance(recipe, str) and Path(recipe).suffix == "":
            raise RecipeError(f"recipe {recipe!r} is neither a YAML mapping nor a file")
    if not isinstance(recipe, dict):
        raise RecipeError("a recipe must be a mapping of stages (or modifiers), got "
                          f"{type(recipe).__name__}")
    if source is None:
        source = yaml.safe_dump(recipe, sort_keys=False)
    return Recipe(_parse_mapping(recipe), source)


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
    try:
        return MODIFIERS[name](**args)  # type: ignore[return-value]
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


# ---- targets ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WeightModule:
    name: str  # module name: the weight is `{name}.weight`
    kind: str  # "Linear" | "Embedding"
    layer: int | None  # decoder layer index; None for embed_tokens / lm_head

    @property
    def weight(self) -> str:
        return self.name + ".weight"


def weight_modules(tensor_names: Sequence[str], num_layers: int,
                   gated_mlp: bool = True) -> list[WeightModule]:
    """The weight-holding modules of a model under canonical decoder names, in execution order
    (every architecture: attention q/k/v/o, MLP [gate/]up/down, lm_head when not tied)."""
    names = set(tensor_names)
    out = [WeightModule("model.embed_tokens", "Embedding", None)]
    mlp = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj") if gated_mlp else \
        ("mlp.up_proj", "mlp.down_proj")
    for i in range(num_layers):
        for sub in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                    "self_attn.o_proj", *mlp):
            out.append(WeightModule(f"model.layers.{i}.{sub}", "Linear", i))
    if "lm_head.weight" in names:
        out.append(WeightModule("lm_head", "Linear", None))
    return out


# transformers' decoder-layer classes: LlamaDecoderLayer, OPTDecoderLayer, GPT2Block, GPTJBlock,
# CodeGenBlock, GPTNeoXLayer, PhiDecoderLayer, ...
DECODER_LAYER_CLASS = r"[A-Z]\w*(DecoderLayer|Block)|GPTNeoXLayer"
_NON_WEIGHT = re.compile(
    r"^[A-Z]\w*(RotaryEmbedding|RMSNorm|LayerNorm|Norm|Activation|SiLU|GELU|Dropout|MatMul"
    r"|Softmax)$|^(QuantizableMatMul|QATMatMul|MatMul\w*|SiLU|GELU|Identity)$")


def match_target(target: str, modules: Sequence[WeightModule]) -> tuple[list[WeightModule], int]:
    """Modules a compressed-tensors style target selects, with its specificity
    (2 exact name, 1 regex, 0 class name). A module name or regex matching a container
    (`model.layers.3`, `model.layers.3.mlp`) selects the weights inside it."""

    def under(prefix: str) -> list[WeightModule]:
        return [m for m in modules if m.name == prefix or m.name.startswith(prefix + ".")]

    if target.startswith("re:"):
        pattern = re.compile(target[3:])
        containers = {m.name.rsplit(".", k)[0] for m in modules for k in range(0, 3)}
        hits = {c for c in containers if pattern.match(c)}
        return [m for m in modules if any(m.name == c or m.name.startswith(c + ".")
                                          for c in hits)], 1
    if target in ("Linear", "Embedding"):
        return [m for m in modules if m.kind == target], 0
    if re.fullmatch(DECODER_LAYER_CLASS, target):
        return [m for m in modules if m.layer is not None], 0
    if re.fullmatch(r"[A-Z]\w*Attention", target) and "Rotary" not in target:
        return [m for m in modules if ".self_attn." in m.name], 0
    if re.fullmatch(r"[A-Z]\w*MLP", target):
        return [m for m in modules if ".mlp." in m.name], 0
    return under(target), 2


def resolve_targets(
    targets: str | Sequence[str], ignore: Sequence[str], modules: Sequence[WeightModule],
    where: str, notes: list[str], tied_embeddings: bool = False,
) -> dict[str, int]:
    """-> {module name: specificity} selected by `targets` minus `ignore`; unmatched targets are
    errors, unmatched ignores and non-weight class names (LlamaRotaryEmbedding, ...) notes."""
    targets = [targets] if isinstance(targets, str) else list(targets)
    selected: dict[str, int] = {}
    for t in targets:
        found, spec = match_target(t, modules)
        if not found:
            if _NON_WEIGHT.match(t):
                notes.append(f"{where}: target {t!r} holds no weights; nothing to compress")
                continue
            raise RecipeError(
                f"{where}: target {t!r} matches no weight of this model; accepted: Linear, "
                "Embedding, a decoder-layer class (LlamaDecoderLayer), a module name "
                "(model.layers.0.mlp.down_proj, lm_head) or `re:<regex>` on module names")
        for m in found:
            selected[m.name] = max(spec, selected.get(m.name, -1))
    for ig in ignore:
        found, _ = match_target(ig, modules)
        # Ignoring what holds no weights (LlamaRotaryEmbedding, ...) or a tied lm_head (not a
        # tensor of its own) is what the recipes people share do; only a miss is worth a note.
        quiet = _NON_WEIGHT.match(ig) or (tied_embeddings and ig in ("lm_head", "re:.*lm_head"))
        if not found and not quiet:
            notes.append(f"{where}: ignore entry {ig!r} has no effect (it matches no weight)")
        for m in found:
            selected.pop(m.name, None)
    return selected


# ---- plan ---------------------------------------------------------------------------------------
@dataclass
class PruneSpec:
    method: str  # "sparsegpt" | "magnitude" | "constant"
    sparsity: float = 0.0
    prunen: int = 0
    prunem: int = 0
    blocksize: int = 128
    percdamp: float = 0.01
    joint_quant: bool = True

    @property
    def structure(self) -> str:
        return f"{self.prunem - self.prunen}:{self.prunem}" if self.prunen else "unstructured"


@dataclass
class QuantSpec:
    weights: QuantizationArgs
    input_activations: QuantizationArgs | None
    method: str  # "rtn" | "gptq"
    blocksize: int = 128
    percdamp: float = 0.01
    actorder: bool = False

    def weight_format(self, cols: int) -> WeightFormat:
        w = self.weights
        group = effective_group_size(cols, w.group_size) if w.strategy == "group" else None
        act = self.input_activations.num_bits if self.input_activations else None
        return WeightFormat(bits=w.num_bits, group_size=group, symmetric=w.symmetric,
                            activation_bits=act)


@dataclass
class TensorPlan:
    module: WeightModule
    prune: PruneSpec | None = None
    quant: QuantSpec | None = None

    @property
    def needs_hessian(self) -> bool:
        return (self.prune is not None and self.prune.method == "sparsegpt") or (
            self.quant is not None and self.quant.method == "gptq")


@dataclass
class Plan:
    tensors: dict[str, TensorPlan]  # by module name, in execution order
    notes: list[str] = field(default_factory=list)


def build_plan(recipe: Recipe, modules: Sequence[WeightModule],
               tied_embeddings: bool = False) -> Plan:
    """Which compression each weight gets. Errors name the modifier and key; notes say what a
    recipe asks for that has no effect on this model. Every stage of a recipe runs in the same
    calibrated one-shot pass, layer by layer."""
    notes: list[str] = []
    by_name = {m.name: m for m in modules}
    prune: dict[str, PruneSpec] = {}
    quant: dict[str, tuple[int, QuantSpec]] = {}
    for where, mod in recipe.modifiers:
        if isinstance(mod, QuantizationModifier):
            for scheme in mod.schemes():
                if scheme.weights is None:
                    continue
                if scheme.weights.num_bits not in (4, 8):
                    raise RecipeError(f"{where}: weights num_bits {scheme.weights.num_bits} is "
                                      "not supported; accepted: 4, 8")
                acts = scheme.input_activations
                if acts is not None and acts.num_bits != 8:
                    raise RecipeError(f"{where}: input_activations num_bits {acts.num_bits} is "
                                      "not supported; accepted: 8 (or null)")
                if acts is not None and not (acts.dynamic and acts.strategy == "token"):
                    notes.append(f"{where}: static {acts.strategy} int8 activations are stored "
                                 "as dynamic per-token int8 (no activation calibration)")
                    acts = QuantizationArgs(num_bits=8, symmetric=True, strategy="token",
                                            dynamic=True)
                hit = resolve_targets(scheme.targets, mod.ignore, modules, where, notes,
                                      tied_embeddings)
                for name, spec in hit.items():
                    kind = by_name[name].kind
                    method = mod.method if kind == "Linear" else "rtn"
                    qs = QuantSpec(
                        weights=scheme.weights,
                        input_activations=acts if kind == "Linear" else None,
                        method=method,
                        blocksize=getattr(mod, "block_size", 128),
                        percdamp=getattr(mod, "dampening_frac", 0.01),
                        actorder=isinstance(mod, GPTQModifier) and mod.use_actorder,
                    )
                    if name not in quant or spec >= quant[name][0]:
                        quant[name] = (spec, qs)
        elif isinstance(mod, SparseGPTModifier | MagnitudePruningModifier):
            hit = resolve_targets(mod.targets, mod.ignore, modules, where, notes,
                                  tied_embeddings)
            n, m = mod.nm
            for name in hit:
                if by_name[name].kind != "Linear":
                    raise RecipeError(f"{where}: {name} is an embedding; pruning applies to "
                                      "linear layers (add it to `ignore`)")
                sgpt = isinstance(mod, SparseGPTModifier)
                prune[name] = PruneSpec(
                    method="sparsegpt" if sgpt else "magnitude",
                    sparsity=mod.target_sparsity, prunen=n, prunem=m,
                    blocksize=mod.block_size if sgpt else 128,
                    percdamp=mod.dampening_frac if sgpt else 0.01,
                    joint_quant=bool(mod.quantize) if sgpt else False,
                )
        elif isinstance(mod, ConstantPruningModifier):
            targets = mod.params if mod.params is not None else mod.targets
            for name in resolve_targets(targets, mod.ignore, modules, where, notes,
                                        tied_embeddings):
                prune.setdefault(name, PruneSpec(method="constant"))
    plans = {}
    for m in modules:
        p = prune.get(m.name)
        q = quant[m.name][1] if m.name in quant else None
        if p is not None and p.method == "sparsegpt" and q is not None and not p.joint_quant:
            notes.append(f"{m.name}: pruned by SparseGPT, then quantized separately "
                         "(quantize: false)")
        if p or q:
            plans[m.name] = TensorPlan(m, p, q)
    if not plans:
        raise RecipeError("the recipe selects no weights to compress")
    return Plan(plans, list(dict.fromkeys(notes)))
