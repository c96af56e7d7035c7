"""What a compression plan is made of: the weights of a model (`WeightModule`), which of them a
recipe target selects (`resolve_targets`), and the steps modifiers plan for each weight.

A modifier (modifiers.py) turns its settings into `Planned` steps, one per weight it targets.
A weight gets at most one pruning step and then at most one quantization step (`TensorPlan`);
`recipe.build_plan` picks them, `calibration.compress_weight` runs them. A step says what it
needs from calibration (`needs_hessian`) and does its work by calling the pure functions
(sparsegpt.py, gptq.py, magnitude.py, quantize.py).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..models.formats import QuantizedTensor, Sparsity, WeightFormat


class RecipeError(ValueError):
    """A recipe that cannot run: the message names the key and what is accepted."""


# ---- the weights of a model ---------------------------------------------------------------------
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


# ---- targets ------------------------------------------------------------------------------------
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
        found, spec = _match(t, modules, where)
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
        found, _ = _match(ig, modules, where)
        # Ignoring what holds no weights (LlamaRotaryEmbedding, ...) or a tied lm_head (not a
        # tensor of its own) is what the recipes people share do; only a miss is worth a note.
        quiet = _NON_WEIGHT.match(ig) or (tied_embeddings and ig in ("lm_head", "re:.*lm_head"))
        if not found and not quiet:
            notes.append(f"{where}: ignore entry {ig!r} has no effect (it matches no weight)")
        for m in found:
            selected.pop(m.name, None)
    return selected


def _match(target: str, modules: Sequence[WeightModule],
           where: str) -> tuple[list[WeightModule], int]:
    """match_target, with a pattern that does not compile a RecipeError naming it."""
    try:
        return match_target(target, modules)
    except re.error as e:
        raise RecipeError(f"{where}: {target!r} is not a regular expression ({e})") from None


@dataclass
class PlanContext:
    """What a modifier's `plan` works with: the model's weights, where the modifier sits in the
    recipe (every message starts with it) and the run's notes."""

    modules: Sequence[WeightModule]
    where: str
    notes: list[str] = field(default_factory=list)
    tied_embeddings: bool = False

    def select(self, targets: str | Sequence[str],
               ignore: Sequence[str]) -> list[tuple[WeightModule, int]]:
        """(module, specificity) of each weight `targets` select minus `ignore`
        (`resolve_targets`)."""
        by_name = {m.name: m for m in self.modules}
        hit = resolve_targets(targets, ignore, self.modules, self.where, self.notes,
                              self.tied_embeddings)
        return [(by_name[name], spec) for name, spec in hit.items()]

    def error(self, message: str) -> RecipeError:
        return RecipeError(f"{self.where}: {message}")

    def note(self, message: str) -> None:
        self.notes.append(f"{self.where}: {message}")


# ---- steps --------------------------------------------------------------------------------------
class Step(ABC):
    """How one modifier compresses one weight (a frozen dataclass of the settings it needs)."""

    slot: ClassVar[str]  # the TensorPlan field it fills: "prune" or "quant"
    # Calibration gives every compressed linear the Hessian of its inputs; a step that cannot
    # run without it (an embedding has none, nor a direct call without one) says so here.
    needs_hessian: ClassVar[bool] = False

    def note(self, plan: TensorPlan) -> str | None:
        """Something worth telling about this step within the weight's whole plan."""
        return None


@dataclass
class Pruned:
    """A pruning step's result: the new weights, which are kept, the structure of the zeros,
    and the integers when the step also quantized (a joint solve)."""

    weight: np.ndarray  # (out, in) fp32
    keep: np.ndarray | None = None  # (out, in) bool, True = kept; None = nothing pruned
    structure: Sparsity | str | None = None  # None: dense; another N:M than 2:4: its string
    quantized: QuantizedTensor | None = None


class PruneStep(Step):
    slot: ClassVar[str] = "prune"

    @abstractmethod
    def prune(self, w: np.ndarray, h: np.ndarray | None,
              quant: WeightFormat | None) -> Pruned:
        """Prune w (out, in) given the Hessian h (in, in) of its inputs (None without
        calibration). `quant` is the format the weight's quantization step gives it (None if it
        has none): a step that prunes and quantizes in one solve returns the integers."""


class QuantStep(Step):
    slot: ClassVar[str] = "quant"

    @abstractmethod
    def weight_format(self, cols: int) -> WeightFormat:
        """The declared format of a quantized weight with `cols` input columns."""

    @abstractmethod
    def quantize(self, w: np.ndarray, h: np.ndarray | None, fmt: WeightFormat,
                 keep: np.ndarray | None) -> QuantizedTensor:
        """Integers of w (out, in) in `fmt` (its `weight_format`, with the pruning's sparsity);
        pruned weights (keep False) stay exactly zero."""


SLOTS = ("prune", "quant")  # the order a weight's steps run in


@dataclass(frozen=True)
class Planned:
    """One step a modifier plans for one weight. In the same slot of the same weight a later
    step replaces an earlier one, unless the earlier one has a higher `rank`."""

    module: WeightModule
    step: PruneStep | QuantStep
    rank: int = 0


@dataclass
class TensorPlan:
    module: WeightModule
    prune: PruneStep | None = None
    quant: QuantStep | None = None

    @property
    def steps(self) -> list[Step]:
        """The steps in the order they run: pruning, then quantization."""
        return [s for s in (self.prune, self.quant) if s is not None]

    @property
    def needs_hessian(self) -> bool:
        return any(s.needs_hessian for s in self.steps)


@dataclass
class Plan:
    tensors: dict[str, TensorPlan]  # by module name, in execution order
    notes: list[str] = field(default_factory=list)
