"""GenerationConfig validation: each bad setting is a clear error naming it."""

from __future__ import annotations

import pytest

from sparsellm.generation import GenerationConfig


@pytest.mark.parametrize("kwargs,match", [
    ({"deterministic": False, "sampling_temperature": 0.0},
     r"invalid sampling_temperature=0.0: sampling needs a finite temperature > 0"),
    ({"deterministic": False, "sampling_temperature": -1.0}, r"invalid sampling_temperature=-1.0"),
    ({"deterministic": False, "sampling_temperature": float("nan")},
     r"invalid sampling_temperature=nan"),
    ({"max_generated_tokens": 0}, r"invalid max_generated_tokens=0: must be an integer >= 1"),
    ({"max_generated_tokens": 2.5}, r"invalid max_generated_tokens=2.5"),
    ({"top_k": -1}, r"invalid top_k=-1: must be an integer >= 0"),
    ({"top_p": 0.0}, r"invalid top_p=0.0: must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"invalid top_p=1.5"),
    ({"repetition_penalty": 0}, r"invalid repetition_penalty=0: must be a finite number > 0"),
    ({"seed": "x"}, r"invalid seed='x': must be an integer"),
    ({"stop": ["ok", ""]}, r"invalid stop=\['ok', ''\]: must be non-empty strings"),
])
def test_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GenerationConfig(**kwargs)


def test_temperature_zero_is_fine_when_greedy():
    assert GenerationConfig(deterministic=True, sampling_temperature=0.0).deterministic


def test_from_kwargs_overrides_and_rejects_unknown():
    base = GenerationConfig(max_generated_tokens=5, stop="x")
    assert base.stop == ["x"]
    cfg = GenerationConfig.from_kwargs(base, top_k=3, seed=None)
    assert (cfg.max_generated_tokens, cfg.top_k, cfg.stop) == (5, 3, ["x"])
    with pytest.raises(ValueError, match=r"unknown generation setting\(s\) \['temprature'\]; "
                                         r"accepted: .*sampling_temperature"):
        GenerationConfig.from_kwargs(base, temprature=0.5)
