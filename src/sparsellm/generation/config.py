"""Generation settings, validated once with messages that say what is accepted."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class GenerationConfig:
    """How to generate. Names follow DeepSparse's text-generation pipeline."""

    max_generated_tokens: int = 256
    force_max_tokens: bool = False  # ignore EOS and always produce max_generated_tokens
    deterministic: bool = True  # greedy; False samples with the settings below
    sampling_temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    repetition_penalty: float = 1.0  # 1.0 = off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.validate()

    @classmethod
    def names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    @classmethod
    def from_kwargs(cls, base: GenerationConfig | None = None, **kwargs: Any) -> GenerationConfig:
        unknown = set(kwargs) - cls.names()
        if unknown:
            raise ValueError(
                f"unknown generation setting(s) {sorted(unknown)}; accepted: {sorted(cls.names())}"
            )
        values = {f.name: getattr(base, f.name) for f in fields(cls)} if base else {}
        values.update({k: v for k, v in kwargs.items() if v is not None})
        return cls(**values)

    def validate(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"invalid {name}={getattr(self, name)!r}: {why}")

        if not _is_int(self.max_generated_tokens) or self.max_generated_tokens < 1:
            raise bad("max_generated_tokens", "must be an integer >= 1")
        if not self.deterministic:
            t = self.sampling_temperature
            if not _is_number(t) or not math.isfinite(t) or t <= 0:
                raise bad("sampling_temperature", "sampling needs a finite temperature > 0 "
                          "(use deterministic=True for greedy decoding)")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise bad("top_k", "must be an integer >= 0 (0 disables it)")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise bad("top_p", "must be in (0, 1]")
        rp = self.repetition_penalty
        if not _is_number(rp) or not math.isfinite(rp) or rp <= 0:
            raise bad("repetition_penalty", "must be a finite number > 0 (1.0 disables it)")
        if self.seed is not None and not _is_int(self.seed):
            raise bad("seed", "must be an integer")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop", "must be non-empty strings")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)
