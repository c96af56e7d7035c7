"""`EngineSettings`: how a model is run (engine, KV cache, speculative decoding), declared once.

Each field is a `setting(...)`: its default, its help, and how the rest of the package sees it.
Everything that runs a model reads this one class:

- the commands' flags: `EngineSettings.add_arguments(parser)` makes them (type, choices from
  the registries, help), `given(args)` / `from_args(args)` read them back (`sparsellm generate`,
  `serve`, `batch`, `benchmark`, `eval`);
- the server config: an endpoint's `kwargs` are validated into this class
  (`server/config.py` builds its pydantic model from these fields);
- `TextGeneration` / `Pipeline.create`: every field is a keyword argument, or pass `settings=`;
- the engines: `engine_kwargs()` gives the fields marked `engine=` to `Engine`, under its
  parameter names (the draft model's engine gets those marked `draft=True` too).

`generation/stack.py` `build_stack` turns settings into the running stack (checkpoint -> Engine
-> draft Engine -> Speculator -> BatchGenerator). A new setting is one field here plus its use;
a field the `Engine` takes needs no use elsewhere (`engine=True`).
"""

from __future__ import annotations

import argparse
import functools
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from dataclasses import replace as _replace
from pathlib import Path
from typing import Any, Self

from ..kernels import FORMATS
from ..models import DEFAULT_MODEL, Checkpoint
from .engine import DEFAULT_PROMPT_CHUNK, KV_CACHE_DTYPES

DEFAULT_SEQUENCE_LENGTH = 1024  # when neither the settings nor an exported deployment say
SELF_DRAFT = "auto"  # as the draft model: the main model itself, in SELF_DRAFT_WEIGHTS
# The format a model drafts for itself in: the best acceptance x draft speed measured
# (SmolLM2 135M fp32, 4 prompts x 96 tokens: int8_a8 2.36x at 94% acceptance, int4_g32_a8
# 1.50x at 84%). A model that already runs in int8 gains nothing from it, and adaptive
# speculation then decodes plainly.
SELF_DRAFT_WEIGHTS = "int8_a8"
ENGINE, SPECULATION = "engine", "speculation"  # the groups of flags


def setting(default: Any, help: str, *, flags: Sequence[str] | None = None,
            choices: Callable[[], Iterable[str]] | None = None, parser_choices: bool = True,
            what: str | None = None, metavar: str | None = None, minimum: int | None = None,
            engine: bool | str = False, draft: bool = True, group: str = ENGINE,
            shared: bool = True, negative: tuple[str, str] | None = None) -> Any:
    """A field of `EngineSettings`.

    help: what it does, without its default (the flags add it). flags: option strings
    (default: `--` and the name with dashes; () for none). choices: the registry's names
    (argparse's choices unless `parser_choices=False`, where the settings' own check names the
    registry in one line: `what` says what was unknown). minimum: an integer's least value.
    engine: the `Engine` takes it (True: under this name; a string: that parameter), also for
    the draft's engine unless `draft=False`. group: ENGINE or SPECULATION (where the flag is
    listed). shared: in the flags every command adds (False: a command asks for it by name).
    negative: (flag, help) of an extra flag that sets it to False (`--no-weights-cache`).
    """
    return field(default=default, metadata=dict(
        help=help, flags=flags, choices=choices, parser_choices=parser_choices, what=what,
        metavar=metavar, minimum=minimum, engine=engine, draft=draft, group=group,
        shared=shared, negative=negative))


def _formats() -> Iterable[str]:
    return FORMATS


def _kv_dtypes() -> Iterable[str]:
    return KV_CACHE_DTYPES


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """How to run a model: its engine, KV cache and speculative decoding."""

    model_path: str | Path | Checkpoint = setting(
        DEFAULT_MODEL, "the model: a path, GGUF file, registry name, hf:org/name, or a loaded "
        "Checkpoint", flags=())  # each command takes the model its own way
    sequence_length: int | None = setting(
        None, "tokens per sequence, prompt + generated (default: an exported deployment's, "
        f"else {DEFAULT_SEQUENCE_LENGTH})", minimum=1, engine=True)
    prompt_processing_sequence_length: int = setting(
        DEFAULT_PROMPT_CHUNK, "prompt tokens processed per step", minimum=1, engine=True)
    # Each command says how many sequences run together its own way (generate: one; serve and
    # batch: --max-concurrent-requests; benchmark and eval: --batch-size).
    batch_size: int = setting(4, "sequences generated together (the KV cache's slots)",
                              minimum=1, engine="max_sequences", shared=False)
    num_cores: int | None = setting(None, "threads (default: all cores)", minimum=1,
                                    engine=True)
    weights: str | None = setting(
        None, "convert every linear weight on load (e.g. int8_a8, int4_g32_a8, sparse_int8_a8) "
        "instead of running the checkpoint's declared formats (an unknown name lists them)",
        choices=_formats, parser_choices=False, what="weights format", metavar="FORMAT",
        engine=True, draft=False)
    weights_cache: str | Path | bool = setting(
        True, "where converted weights are cached for the next load (default: "
        "$SPARSELLM_CACHE_DIR, else ~/.cache/sparsellm)", metavar="DIR", engine=True,
        negative=("--no-weights-cache", "convert on every load, write no cache entry"))
    kv_cache_dtype: str = setting(
        "fp32", "KV-cache storage (fp16 / int8: a half / a quarter of the memory and of the "
        "bytes attention reads)", choices=_kv_dtypes, engine=True)
    draft_model_path: str | Path | Checkpoint | None = setting(
        None, "draft model for speculative decoding (same tokenizer, smaller or compressed); "
        f"'{SELF_DRAFT}': the model itself in a smaller format (self-speculation, no second "
        "model)", flags=("--draft-model",), group=SPECULATION)
    draft_weights: str | None = setting(
        None, f"convert the draft's weights on load (with --draft-model {SELF_DRAFT}, the "
        f"format the model drafts for itself in; default {SELF_DRAFT_WEIGHTS})",
        choices=_formats, parser_choices=False, what="weights format", metavar="FORMAT",
        group=SPECULATION)
    prompt_lookup: bool = setting(
        False, "speculative decoding by prompt lookup: draft the tokens that followed the last "
        "n-gram's earlier occurrence in the prompt or output (no model; with --draft-model, "
        "the draft model drafts where lookup finds nothing)", group=SPECULATION)
    num_speculative_tokens: int = setting(4, "most tokens drafted per step", minimum=1,
                                          group=SPECULATION)
    adaptive_speculation: bool = setting(
        True, "draft as many tokens per step (0 to --num-speculative-tokens) as the measured "
        "acceptance and drafting cost make worthwhile; --no-adaptive-speculation drafts "
        "--num-speculative-tokens every step", group=SPECULATION)
    internal_kv_cache: bool = setting(
        True, "accepted for DeepSparse compatibility: the KV cache is always internal",
        flags=())

    def __post_init__(self) -> None:
        for f in fields(self):
            value, meta = getattr(self, f.name), f.metadata
            if value is None or not meta:
                continue
            if _kinds(type(self))[f.name] is bool and not isinstance(value, bool):
                raise ValueError(f"{f.name} must be True or False, got {value!r}")
            if meta["minimum"] is not None:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"{f.name} must be an integer, got {value!r}")
                if value < meta["minimum"]:
                    raise ValueError(f"{f.name} must be >= {meta['minimum']}, got {value!r}")
            if meta["choices"] is not None:
                accepted = list(meta["choices"]())
                if value not in accepted:
                    raise ValueError(f"unknown {meta['what'] or f.name} {value!r}; accepted: "
                                     f"{', '.join(accepted)}")

    # ---- as keyword arguments -------------------------------------------------------------------
    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def replace(self, **values: Any) -> Self:
        """A copy with `values` set; None leaves a setting as it is (an unset flag or keyword).
        An unknown name is a TypeError, as for a function's keyword."""
        unknown = set(values) - set(self.names())
        if unknown:
            raise TypeError(f"unknown engine setting(s) {sorted(unknown)}; accepted: "
                            f"{', '.join(self.names())}")
        values = {k: v for k, v in values.items() if v is not None}
        return _replace(self, **values) if values else self

    def resolve(self, checkpoint: Checkpoint) -> Self:
        """With the defaults that depend on the model: sequence_length an exported deployment's,
        else DEFAULT_SEQUENCE_LENGTH."""
        if self.sequence_length is not None:
            return self
        return _replace(self, sequence_length=int(checkpoint.deployment.get(
            "sequence_length", DEFAULT_SEQUENCE_LENGTH)))

    def engine_kwargs(self, draft: bool = False) -> dict[str, Any]:
        """`Engine` keyword arguments: the fields marked `engine=` (`draft`: those the draft
        model's engine shares). sequence_length must be set (`resolve`)."""
        if self.sequence_length is None:
            raise ValueError("sequence_length is unset: resolve the settings for a checkpoint")
        out = {}
        for f in fields(self):
            target = f.metadata.get("engine")
            if target and (not draft or f.metadata["draft"]):
                out[f.name if target is True else target] = getattr(self, f.name)
        return out

    # ---- as command-line flags ------------------------------------------------------------------
    @classmethod
    def flag_fields(cls, names: Iterable[str] | None = None, group: str | None = None
                    ) -> list[Field]:
        """The fields that are flags: `names` in that order, else every shared one (of `group`)."""
        by_name = {f.name: f for f in fields(cls) if _flags(f)}
        if names is not None:
            return [by_name[n] for n in names]
        return [f for f in by_name.values() if f.metadata["shared"]
                and (group is None or f.metadata["group"] == group)]

    @classmethod
    def flag(cls, name: str) -> str:
        """The field's command-line flag, e.g. `--draft-model` for draft_model_path."""
        return _flags(next(f for f in fields(cls) if f.name == name))[0]

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                      names: Iterable[str] | None = None, *, group: str | None = None,
                      exclude: Iterable[str] = (), defaults: dict[str, Any] | None = None,
                      helps: dict[str, str] | None = None,
                      flags: dict[str, Sequence[str]] | None = None) -> None:
        """Add the settings' flags to `parser` (or an argument group): `names`, else every
        shared one (of `group`, minus `exclude`). Unset flags are None (`given`) unless a
        command sets its own `defaults`; `helps` and `flags` replace a field's help or
        option strings for one command."""
        defaults, helps, flags = defaults or {}, helps or {}, flags or {}
        for f in cls.flag_fields(names, group):
            if f.name in exclude:
                continue
            meta, kind = f.metadata, _kinds(cls)[f.name]
            default = defaults.get(f.name)
            options = list(flags.get(f.name, _flags(f)))
            kwargs: dict[str, Any] = dict(dest=_dest(f), default=default)
            shown = default if f.name in defaults else f.default
            help_text = helps.get(f.name) or meta["help"] + \
                ("" if "default" in meta["help"] else _default_text(shown))
            choices = list(meta["choices"]()) if meta["choices"] else None
            if kind is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["type"] = kind
                kwargs["metavar"] = meta["metavar"]
                if choices and meta["parser_choices"]:
                    kwargs["choices"] = choices
            parser.add_argument(*options, help=help_text, **kwargs)
            if meta["negative"]:
                negative, negative_help = meta["negative"]
                parser.add_argument(negative, dest=_dest(f), action="store_const", const=False,
                                    help=negative_help)

    @classmethod
    def given(cls, args: argparse.Namespace, names: Iterable[str] | None = None
              ) -> dict[str, Any]:
        """The settings given on the command line (flags left unset are None and left out)."""
        out = {}
        for f in cls.flag_fields(names) if names is not None else \
                [f for f in fields(cls) if _flags(f)]:
            value = getattr(args, _dest(f), None)
            if value is not None:
                out[f.name] = value
        return out

    @classmethod
    def from_args(cls, args: argparse.Namespace, **defaults: Any) -> Self:
        """Settings from the command line, over `defaults` (a command's own)."""
        return cls(**defaults).replace(**cls.given(args))


def _flags(f: Field) -> list[str]:
    flags = f.metadata.get("flags") if f.metadata else ()
    if flags is None:
        return ["--" + f.name.replace("_", "-")]
    return list(flags)


def _dest(f: Field) -> str:
    """argparse's name for the flag's value (`--draft-model` -> draft_model), which is also
    what the Ray app's arguments are called."""
    return next(o for o in _flags(f) if o.startswith("--"))[2:].replace("-", "_")


@functools.cache
def _kinds(cls: type) -> dict[str, type]:
    """Each field's kind, from its type: bool (a flag that takes no value; True or False
    only), int, or str (anything else: paths, names)."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        members = typing.get_args(hint) or (hint,)
        out[name] = bool if bool in members and str not in members else \
            int if int in members else str
    return out


def _default_text(default: Any) -> str:
    if default is None or default is MISSING:
        return ""
    if isinstance(default, bool):
        return f" (default: {'yes' if default else 'no'})"
    return f" (default: {default})"
