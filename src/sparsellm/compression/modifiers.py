"""Recipe modifiers: strict pydantic configs (unknown keys are errors) around the pure
compression functions. Both families are accepted: SparseML (`QuantizationModifier` with
`scheme_overrides`, `SparseGPTModifier` with `quantize`) and llm-compressor (`scheme` presets,
`config_groups`, `mask_structure`, `GPTQModifier`).

A modifier owns its plan: `Modifier.plan` selects the weights it targets and gives each one the
step (plan.py `PruneStep` / `QuantStep`, defined next to the modifier) that says what it needs
from calibration and how it compresses one weight. Nothing else knows the modifier's type.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..models.compressed import measured_structure
from ..models.ct_args import activation_args, scheme_args, weight_format
from ..models.formats import QuantizedTensor, Sparsity, WeightFormat
from .gptq import gptq_quantize
from .magnitude import magnitude_prune
from .plan import PlanContext, Planned, Pruned, PruneStep, QuantStep, TensorPlan
from .quantize import effective_group_size, quantize_embedding, rtn_quantize
from .sparsegpt import obs_compress


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# Keys llm-compressor / SparseML modifiers carry for scheduling or training; meaningless in a
# one-shot run, accepted so recipes written for those tools run unchanged.
class _ScheduleKeys(Strict):
    index: int | None = None
    group: str | None = None
    start: float | None = None
    end: float | None = None
    update: float | None = None


class Modifier(_ScheduleKeys, ABC):
    """A recipe entry: which weights it compresses and with which step."""

    @abstractmethod
    def plan(self, ctx: PlanContext) -> list[Planned]:
        """One planned step per weight this modifier targets (`ctx.select`); errors are
        `ctx.error(...)` (a RecipeError naming the modifier), notes `ctx.note(...)`."""


class QuantizationArgs(Strict):
    """compressed-tensors QuantizationArgs (the subset that describes integer weights and
    dynamic int8 activations)."""

    num_bits: int = 8
    type: str = "int"
    symmetric: bool = True
    group_size: int | None = None
    strategy: Literal["tensor", "channel", "group", "token"] | None = None
    dynamic: bool | str = False
    actorder: bool | str | None = None
    observer: str | None = None
    observer_kwargs: dict[str, Any] = Field(default_factory=dict)
    block_structure: Any = None

    @field_validator("type")
    @classmethod
    def _int_only(cls, v: str) -> str:
        if v != "int":
            raise ValueError(f"quantization type {v!r} is not supported; supported: 'int'")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> QuantizationArgs:
        if self.group_size is not None and self.group_size <= 0:
            raise ValueError("group_size must be positive")
        if self.strategy is None:
            self.strategy = "group" if self.group_size else "channel"
        if self.strategy == "group" and not self.group_size:
            raise ValueError("strategy 'group' needs a group_size")
        return self


class QuantizationScheme(Strict):
    """One compressed-tensors config group: which modules, how weights and inputs are stored."""

    targets: list[str] = Field(default_factory=lambda: ["Linear"])
    weights: QuantizationArgs | None = None
    input_activations: QuantizationArgs | None = None
    output_activations: None = None
    format: str | None = None


class SchemeOverride(Strict):
    """SparseML `scheme_overrides` entry: replaces parts of the default scheme."""

    weights: QuantizationArgs | None = None
    input_activations: QuantizationArgs | None = None
    output_activations: None = None


# compressed-tensors' preset schemes, as the formats they declare (models/ct_args.py writes
# their arguments)
PRESET_SCHEMES: dict[str, dict[str, Any]] = {name: scheme_args(fmt) for name, fmt in {
    "W8A8": WeightFormat(bits=8, activation_bits=8),
    "INT8": WeightFormat(bits=8, activation_bits=8),
    "W8A16": WeightFormat(bits=8),
    "W4A16": WeightFormat(bits=4, group_size=128),
    "W4A16_ASYM": WeightFormat(bits=4, group_size=128, symmetric=False),
    "W4A8": WeightFormat(bits=4, group_size=128, activation_bits=8),
}.items()}


def preset_scheme(name: str, targets: list[str]) -> QuantizationScheme:
    if name.upper() not in PRESET_SCHEMES:
        raise ValueError(f"unknown scheme {name!r}; accepted: {', '.join(PRESET_SCHEMES)}")
    return QuantizationScheme(targets=targets, **PRESET_SCHEMES[name.upper()])


# ---- quantization -------------------------------------------------------------------------------
_DYNAMIC_A8 = QuantizationArgs(**activation_args(WeightFormat(bits=8, activation_bits=8)))


@dataclass(frozen=True)
class RoundToNearest(QuantStep):
    """Round-to-nearest integers (`rtn_quantize`); `input_activations` declares dynamic int8
    activations (nothing to calibrate)."""

    weights: QuantizationArgs
    input_activations: QuantizationArgs | None = None

    def weight_format(self, cols: int) -> WeightFormat:
        w = self.weights
        group = effective_group_size(cols, w.group_size) if w.strategy == "group" else None
        acts = self.input_activations
        return weight_format(w.model_dump(), acts.model_dump() if acts else None, group)

    def quantize(self, w: np.ndarray, h: np.ndarray | None, fmt: WeightFormat,
                 keep: np.ndarray | None) -> QuantizedTensor:
        return rtn_quantize(w, fmt, mask=keep)


@dataclass(frozen=True)
class EmbeddingRows(RoundToNearest):
    """An embedding table quantized row by row (`quantize_embedding`'s format): each token's
    vector gets its own scale, whatever the scheme's groups; activations stay float."""

    def weight_format(self, cols: int) -> WeightFormat:
        return weight_format(self.weights.model_dump(), None)

    def quantize(self, w: np.ndarray, h: np.ndarray | None, fmt: WeightFormat,
                 keep: np.ndarray | None) -> QuantizedTensor:
        return quantize_embedding(w, fmt)


@dataclass(frozen=True)
class GPTQ(RoundToNearest):
    """GPTQ (`gptq_quantize`): rounding errors compensated through the input Hessian."""

    blocksize: int = 128
    percdamp: float = 0.01
    actorder: bool = False
    needs_hessian: ClassVar[bool] = True

    def quantize(self, w: np.ndarray, h: np.ndarray | None, fmt: WeightFormat,
                 keep: np.ndarray | None) -> QuantizedTensor:
        assert h is not None  # needs_hessian: checked before any step runs
        return gptq_quantize(w, h, fmt, blocksize=self.blocksize, percdamp=self.percdamp,
                             actorder=self.actorder, mask=keep)


def _check_scheme(scheme: QuantizationScheme, ctx: PlanContext) -> QuantizationArgs | None:
    """Refuse bits sparsellm cannot run; -> the scheme's input activations as they run
    (dynamic per-token int8) or None."""
    assert scheme.weights is not None
    if scheme.weights.num_bits not in (4, 8):
        raise ctx.error(f"weights num_bits {scheme.weights.num_bits} is not supported; "
                        "accepted: 4, 8")
    acts = scheme.input_activations
    if acts is not None and acts.num_bits != 8:
        raise ctx.error(f"input_activations num_bits {acts.num_bits} is not supported; "
                        "accepted: 8 (or null)")
    if acts is not None and not (acts.dynamic and acts.strategy == "token"):
        ctx.note(f"static {acts.strategy} int8 activations are stored as dynamic per-token "
                 "int8 (no activation calibration)")
        return _DYNAMIC_A8
    return acts


class QuantizationModifier(Modifier):
    """Round-to-nearest weight quantization (+ declared dynamic int8 activations)."""

    targets: str | list[str] = Field(default_factory=lambda: ["Linear"])
    ignore: list[str] = Field(default_factory=list)
    scheme: str | dict[str, list[str]] | None = None
    config_groups: dict[str, QuantizationScheme] | None = None
    scheme_overrides: dict[str, SchemeOverride | None] | None = None
    kv_cache_scheme: None = None
    # SparseML keys: static activation calibration is not implemented (int8 activations are
    # dynamic per token, which needs no calibration), so these are accepted as no-ops.
    post_oneshot_calibration: bool = False
    num_calibration_steps: int | None = None
    disable_quantization_observer_epoch: float | None = None
    freeze_bn_stats_epoch: float | None = None

    @field_validator("scheme")
    @classmethod
    def _known_scheme(cls, v: Any) -> Any:
        names = [v] if isinstance(v, str) else list(v or {})
        for name in names:
            if name.upper() not in PRESET_SCHEMES:
                raise ValueError(f"unknown scheme {name!r}; accepted: "
                                 f"{', '.join(PRESET_SCHEMES)}")
        return v

    def schemes(self) -> list[QuantizationScheme]:
        """The config groups this modifier applies, in priority order (later wins)."""
        targets = [self.targets] if isinstance(self.targets, str) else list(self.targets)
        out: list[QuantizationScheme] = []
        if self.config_groups:
            out += list(self.config_groups.values())
        if isinstance(self.scheme, str):
            out.append(preset_scheme(self.scheme, targets))
        elif isinstance(self.scheme, dict):
            out += [preset_scheme(name, t) for name, t in self.scheme.items()]
        if self.scheme_overrides is not None:
            # SparseML's default scheme: int8 weights and int8 inputs on every target; each
            # override (a class name like Linear / Embedding, or a module name) edits it.
            base = preset_scheme("W8A8", targets)
            if not out:
                out.append(base)
            for key, override in self.scheme_overrides.items():
                fields = (override.model_dump(exclude_unset=True) if override else {})
                merged = {"weights": base.weights, "input_activations": base.input_activations,
                          **{k: v for k, v in fields.items() if k != "output_activations"}}
                if isinstance(merged["weights"], dict):
                    merged["weights"] = QuantizationArgs(**merged["weights"])
                if isinstance(merged["input_activations"], dict):
                    merged["input_activations"] = QuantizationArgs(**merged["input_activations"])
                out.append(QuantizationScheme(targets=[key], **merged))
        if not out:
            out.append(preset_scheme("W8A8", targets))
        return out

    def plan(self, ctx: PlanContext) -> list[Planned]:
        """Each scheme's weights on its targets; the most specific target wins, then the later
        scheme (compressed-tensors' rule): a step ranks by its target's specificity."""
        planned = []
        for scheme in self.schemes():
            if scheme.weights is None:  # activations only: nothing to do to the weights
                continue
            acts = _check_scheme(scheme, ctx)
            for module, specificity in ctx.select(scheme.targets, self.ignore):
                step = EmbeddingRows(scheme.weights) if module.kind == "Embedding" else \
                    self.linear_step(scheme.weights, acts)
                planned.append(Planned(module, step, rank=specificity))
        return planned

    def linear_step(self, weights: QuantizationArgs,
                    input_activations: QuantizationArgs | None) -> QuantStep:
        """How this modifier quantizes a linear weight."""
        return RoundToNearest(weights, input_activations)


class GPTQModifier(QuantizationModifier):
    """GPTQ: quantization with Hessian-based error compensation (calibrated)."""

    block_size: int = Field(default=128, gt=0)
    dampening_frac: float = Field(default=0.01, ge=0)
    actorder: bool | Literal["static", "group", "weight"] | None = None
    sequential_update: bool = True
    offload_hessians: bool = False

    @property
    def use_actorder(self) -> bool:
        """Activation order (any of True / static / group / weight): columns by decreasing
        Hessian diagonal, group scales computed up front ("static groups")."""
        return bool(self.actorder)

    def linear_step(self, weights: QuantizationArgs,
                    input_activations: QuantizationArgs | None) -> QuantStep:
        return GPTQ(weights, input_activations, blocksize=self.block_size,
                    percdamp=self.dampening_frac, actorder=self.use_actorder)


def parse_mask_structure(value: str) -> tuple[int, int]:
    """'0:0' (unstructured) or 'N:M' -> (N, M): N zeros in every M consecutive weights."""
    try:
        n, m = (int(x) for x in str(value).split(":"))
    except ValueError:
        raise ValueError(
            f"mask_structure must be '0:0' (unstructured) or 'N:M', got {value!r}") from None
    if (n, m) != (0, 0) and not 0 < n < m:
        raise ValueError(f"mask_structure {value!r} needs 0 < N < M")
    return n, m


# ---- pruning ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _TargetSparsity(PruneStep):
    sparsity: float = 0.0  # of the whole matrix, when not N:M
    prunen: int = 0  # N:M: `prunen` zeros in every `prunem` consecutive weights of a row
    prunem: int = 0

    @property
    def structure(self) -> Sparsity | str:
        """The mask's `Sparsity` (another N:M than 2:4 stays its string: no kernel runs it)."""
        if not self.prunen:
            return Sparsity.BITMASK
        nm = f"{self.prunem - self.prunen}:{self.prunem}"
        return Sparsity.TWO_FOUR if nm == Sparsity.TWO_FOUR else nm


@dataclass(frozen=True)
class Magnitude(_TargetSparsity):
    """Zero the smallest |w| (`magnitude_prune`)."""

    def prune(self, w: np.ndarray, h: np.ndarray | None,
              quant: WeightFormat | None) -> Pruned:
        pruned, keep = magnitude_prune(w, self.sparsity, self.prunen, self.prunem)
        return Pruned(pruned, keep, self.structure)


@dataclass(frozen=True)
class SparseGPT(_TargetSparsity):
    """SparseGPT (`obs_compress`); with `joint_quant`, a weight that is also quantized is
    pruned and quantized in the same solve."""

    blocksize: int = 128
    percdamp: float = 0.01
    joint_quant: bool = True
    needs_hessian: ClassVar[bool] = True

    def prune(self, w: np.ndarray, h: np.ndarray | None,
              quant: WeightFormat | None) -> Pruned:
        assert h is not None  # needs_hessian: checked before any step runs
        joint_fmt = quant if self.joint_quant else None
        res = obs_compress(w, h, sparsity=self.sparsity, prunen=self.prunen,
                           prunem=self.prunem, quant=joint_fmt, blocksize=self.blocksize,
                           percdamp=self.percdamp)
        if joint_fmt is None:
            return Pruned(res.weight, res.mask, self.structure)
        fmt = replace(joint_fmt, sparsity=self.structure)
        return Pruned(res.weight, res.mask, self.structure,
                      QuantizedTensor(res.q, res.scale, res.zero_point, fmt, res.mask))

    def note(self, plan: TensorPlan) -> str | None:
        if plan.quant is not None and not self.joint_quant:
            return f"{plan.module.name}: pruned by SparseGPT, then quantized separately " \
                "(quantize: false)"
        return None


@dataclass(frozen=True)
class KeepZeros(PruneStep):
    """Keep the zeros a weight already has; their structure is measured."""

    def prune(self, w: np.ndarray, h: np.ndarray | None,
              quant: WeightFormat | None) -> Pruned:
        keep = w != 0
        structure = None if keep.all() else measured_structure(~keep)
        return Pruned(w, keep if structure else None, structure)


# Two pruning steps for one weight: the later modifier's wins (targets' specificity plays no
# part), except that keeping zeros never replaces a pruning.
_PRUNING_RANK = 1
_KEEP_ZEROS_RANK = 0


class _PruningModifier(Modifier):
    sparsity: float | None = Field(default=None, ge=0.0, lt=1.0)
    mask_structure: str = "0:0"
    targets: str | list[str] = Field(
        default_factory=lambda: [r"re:model\.layers\.\d+$"])
    ignore: list[str] = Field(default_factory=list)

    @field_validator("mask_structure")
    @classmethod
    def _mask(cls, v: str) -> str:
        if v == "unstructured":
            return "0:0"
        parse_mask_structure(v)
        return v

    @property
    def nm(self) -> tuple[int, int]:
        return parse_mask_structure(self.mask_structure)

    @property
    def target_sparsity(self) -> float:
        n, m = self.nm
        return n / m if m else float(self.sparsity or 0.0)

    @abstractmethod
    def pruning(self) -> PruneStep:
        """The step this modifier gives each weight it targets."""

    def plan(self, ctx: PlanContext) -> list[Planned]:
        step = self.pruning()
        planned = []
        for module, _ in ctx.select(self.targets, self.ignore):
            if module.kind != "Linear":
                raise ctx.error(f"{module.name} is an embedding; pruning applies to linear "
                                "layers (add it to `ignore`)")
            planned.append(Planned(module, step, rank=_PRUNING_RANK))
        return planned


class SparseGPTModifier(_PruningModifier):
    """SparseGPT one-shot pruning; with `quantize` (default) and a quantization modifier on the
    same weights, pruning and quantization are solved jointly."""

    sparsity: float | None = Field(default=None, ge=0.0, lt=1.0)
    block_size: int = Field(default=128, gt=0)
    dampening_frac: float = Field(default=0.01, ge=0)
    quantize: bool | dict[str, Any] = True
    sequential_update: bool = True
    sequential_targets: str | list[str] | None = None
    preserve_sparsity_mask: bool = False
    offload_hessians: bool = False
    sparsity_profile: None = None

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for old, new in (("blocksize", "block_size"), ("percdamp", "dampening_frac")):
                if old in data:
                    data[new] = data.pop(old)
        return data

    @model_validator(mode="after")
    def _needs_sparsity(self) -> SparseGPTModifier:
        if self.sparsity is None and self.nm == (0, 0):
            raise ValueError("SparseGPTModifier needs `sparsity` or an N:M `mask_structure`")
        return self

    def pruning(self) -> PruneStep:
        n, m = self.nm
        return SparseGPT(self.target_sparsity, n, m, blocksize=self.block_size,
                         percdamp=self.dampening_frac, joint_quant=bool(self.quantize))


class MagnitudePruningModifier(_PruningModifier):
    """Magnitude pruning (the baseline): zero the smallest |w|."""

    init_sparsity: float | None = Field(default=None, ge=0.0, lt=1.0)
    final_sparsity: float | None = Field(default=None, ge=0.0, lt=1.0)
    params: str | list[str] | None = None
    leave_enabled: bool = True
    update_frequency: float | None = None
    mask_type: str | None = None

    @model_validator(mode="after")
    def _resolve(self) -> MagnitudePruningModifier:
        if self.final_sparsity is not None:
            self.sparsity = self.final_sparsity
        if self.params is not None:
            self.targets = self.params
        if self.mask_type is not None:
            self.mask_structure = self._mask(self.mask_type)
        if self.sparsity is None and self.nm == (0, 0):
            raise ValueError("MagnitudePruningModifier needs `sparsity` (or `final_sparsity`) "
                             "or an N:M `mask_structure`")
        return self

    def pruning(self) -> PruneStep:
        n, m = self.nm
        return Magnitude(self.target_sparsity, n, m)


class ConstantPruningModifier(Modifier):
    """Keep the zeros the weights already have (a previously pruned model stays sparse through
    quantization)."""

    targets: str | list[str] = Field(default_factory=lambda: [r"re:model\.layers\.\d+$"])
    ignore: list[str] = Field(default_factory=list)
    params: str | list[str] | None = None
    leave_enabled: bool = True

    def plan(self, ctx: PlanContext) -> list[Planned]:
        # An embedding is quantized row by row and never stored sparse: no zeros to keep.
        targets = self.params if self.params is not None else self.targets
        return [Planned(module, KeepZeros(), rank=_KEEP_ZEROS_RANK)
                for module, _ in ctx.select(targets, self.ignore) if module.kind == "Linear"]


# The names recipes spell modifiers with.
MODIFIERS: dict[str, type[Modifier]] = {
    "SparseGPTModifier": SparseGPTModifier,
    "GPTQModifier": GPTQModifier,
    "QuantizationModifier": QuantizationModifier,
    "MagnitudePruningModifier": MagnitudePruningModifier,
    "ConstantPruningModifier": ConstantPruningModifier,
}
