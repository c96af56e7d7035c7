"""EngineSettings: one dataclass makes the commands' flags, validates the server config's
endpoint kwargs and is what TextGeneration and the engines take (issue 54 item 1).

The first test adds a setting the way a developer would, one field declared in this file, and
follows it from the command line through the server config and the model provider to the
pipeline's engine (and its draft's engine)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

import pytest

from sparsellm import TextGeneration
from sparsellm.engine import EngineSettings
from sparsellm.engine.engine import DEFAULT_PROMPT_CHUNK, KV_CACHE_DTYPES
from sparsellm.engine.settings import DEFAULT_SEQUENCE_LENGTH, setting
from sparsellm.kernels import FORMATS
from sparsellm.server.config import ServerConfig
from sparsellm.server.metrics import Metrics
from sparsellm.server.options import add_arguments as add_serve_arguments
from sparsellm.server.options import server_config
from sparsellm.server.provider import ModelProvider


@dataclass(frozen=True, kw_only=True)
class WithDynamicInt8(EngineSettings):
    """A new setting: an Engine parameter no command exposes yet. Its field is all it needs."""

    dynamic_int8: bool = setting(
        True, "weight-only formats quantize their activations to int8 where an integer kernel "
        "is faster", engine=True)


def test_a_new_setting_is_one_field_seen_by_the_cli_the_server_config_and_the_pipeline(
        tiny_llama_dir, tmp_path):
    # the command line: `sparsellm serve`'s parser, made with the settings class, has the flag
    parser = argparse.ArgumentParser(prog="serve")
    add_serve_arguments(parser, settings=WithDynamicInt8)
    args = parser.parse_args([str(tiny_llama_dir), "--no-dynamic-int8", "--sequence-length", "32",
                              "--draft-model", "auto"])
    assert WithDynamicInt8.given(args) == {"dynamic_int8": False, "sequence_length": 32,
                                           "draft_model_path": "auto"}
    base = argparse.ArgumentParser(prog="serve")
    add_serve_arguments(base)  # EngineSettings itself has no such flag
    assert base.parse_known_args([str(tiny_llama_dir), "--no-dynamic-int8"])[1] == \
        ["--no-dynamic-int8"]
    help_text = parser.format_help()
    assert "--dynamic-int8, --no-dynamic-int8" in help_text and "(default: yes)" in help_text

    # the server config: the flags become the endpoint's kwargs, validated as the settings
    config = server_config(args, settings=WithDynamicInt8)
    endpoint = config.endpoints[0]
    assert endpoint.kwargs["dynamic_int8"] is False
    assert isinstance(endpoint.settings, WithDynamicInt8) and not endpoint.settings.dynamic_int8
    # ... and a config file's kwargs: accepted with the field, refused without it, checked
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"endpoints:\n  - model: {tiny_llama_dir}\n"
                   "    kwargs: {dynamic_int8: false, max_generated_tokens: 4}\n")
    assert ServerConfig.load(cfg, settings=WithDynamicInt8).endpoints[0].settings \
        .dynamic_int8 is False
    with pytest.raises(ValueError, match=r"unknown kwargs \['dynamic_int8'\]"):
        ServerConfig.load(cfg)
    cfg.write_text(f"endpoints:\n  - model: {tiny_llama_dir}\n"
                   "    kwargs: {dynamic_int8: maybe}\n")
    with pytest.raises(ValueError, match=r"endpoints.0: kwargs.dynamic_int8: Input should be a "
                                         r"valid boolean"):
        ServerConfig.load(cfg, settings=WithDynamicInt8)

    # the pipeline: the server's provider builds it from the endpoint's settings; the engine
    # and the draft model's engine get the new field
    served = ModelProvider(config).load(Metrics())[0]
    pipeline = served.pipeline
    assert isinstance(pipeline.settings, WithDynamicInt8)
    assert pipeline.engine.dynamic_int8 is False and pipeline.draft_engine.dynamic_int8 is False
    assert pipeline.engine.max_sequences == config.max_concurrent_requests
    # ... and TextGeneration as a keyword argument over the settings class
    direct = TextGeneration(tiny_llama_dir, settings=WithDynamicInt8(), dynamic_int8=False,
                            sequence_length=32, batch_size=1)
    assert direct.engine.dynamic_int8 is False and direct.draft_engine is None
    assert TextGeneration(tiny_llama_dir, settings=WithDynamicInt8(), sequence_length=32,
                          batch_size=1).engine.dynamic_int8 is True


def test_flags_keep_their_names_and_renames():
    parser = argparse.ArgumentParser()
    EngineSettings.add_arguments(parser)
    args = parser.parse_args(["--draft-model", "auto", "--no-weights-cache", "--kv-cache-dtype",
                              "int8", "--prompt-lookup", "--no-adaptive-speculation",
                              "--num-speculative-tokens", "6", "--weights", "int8_a8"])
    assert EngineSettings.given(args) == dict(
        draft_model_path="auto", weights_cache=False, kv_cache_dtype="int8", prompt_lookup=True,
        adaptive_speculation=False, num_speculative_tokens=6, weights="int8_a8")
    assert EngineSettings.given(parser.parse_args([])) == {}  # unset flags are left out
    assert EngineSettings.from_args(parser.parse_args(["--weights-cache", "/tmp/c"])) == \
        EngineSettings(weights_cache="/tmp/c")  # a folder, though the default is True
    assert EngineSettings.flag("draft_model_path") == "--draft-model"
    # choices come from the registries
    kv = next(a for a in parser._actions if a.dest == "kv_cache_dtype")
    assert kv.choices == list(KV_CACHE_DTYPES)
    # the model and the DeepSparse-compatibility keyword are no flags; batch size is asked for
    dests = {a.dest for a in parser._actions}
    assert not dests & {"model_path", "internal_kv_cache", "batch_size"}
    only = argparse.ArgumentParser()
    EngineSettings.add_arguments(only, ["batch_size"], defaults={"batch_size": 1},
                                 flags={"batch_size": ("--batch-size", "-b")})
    assert EngineSettings.from_args(only.parse_args(["-b", "3"])).batch_size == 3
    assert EngineSettings.from_args(only.parse_args([])).batch_size == 1


def test_settings_check_their_values_with_the_registries():
    with pytest.raises(ValueError, match="unknown weights format 'int9'; accepted: " +
                       ", ".join(FORMATS[:3])):
        EngineSettings(weights="int9")
    with pytest.raises(ValueError, match="unknown weights format 'int3'"):
        EngineSettings(draft_weights="int3")
    with pytest.raises(ValueError, match="unknown kv_cache_dtype 'fp8'; accepted: fp32, fp16"):
        EngineSettings(kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        EngineSettings(batch_size=0)
    with pytest.raises(ValueError, match="num_cores must be an integer, got True"):
        EngineSettings(num_cores=True)
    with pytest.raises(ValueError, match="prompt_lookup must be True or False, got 'yes'"):
        EngineSettings(prompt_lookup="yes")
    settings = EngineSettings(sequence_length=64)
    # replace: None leaves a setting as it is (an unset flag); an unknown name is a TypeError
    assert settings.replace(sequence_length=None, batch_size=2) == \
        EngineSettings(sequence_length=64, batch_size=2)
    with pytest.raises(TypeError, match=r"unknown engine setting\(s\) \['bogus'\]"):
        settings.replace(bogus=1)


def test_engine_kwargs_are_the_engines_parameters():
    settings = EngineSettings(sequence_length=64, batch_size=3, weights="int8_a8",
                              kv_cache_dtype="fp16", draft_model_path="auto")
    assert settings.engine_kwargs() == dict(
        sequence_length=64, prompt_processing_sequence_length=DEFAULT_PROMPT_CHUNK,
        max_sequences=3, num_cores=None, weights="int8_a8", weights_cache=True,
        kv_cache_dtype="fp16")
    # the draft's engine is sized as the model's; its weights are draft_weights'
    assert settings.engine_kwargs(draft=True) == {
        k: v for k, v in settings.engine_kwargs().items() if k != "weights"}
    with pytest.raises(ValueError, match="sequence_length is unset"):
        EngineSettings().engine_kwargs()


def test_sequence_length_defaults_to_the_deployments(tiny_llama_dir):
    from sparsellm.models import load_checkpoint

    checkpoint = load_checkpoint(tiny_llama_dir)
    assert EngineSettings().resolve(checkpoint).sequence_length == DEFAULT_SEQUENCE_LENGTH
    checkpoint.deployment = {"sequence_length": 96}
    assert EngineSettings().resolve(checkpoint).sequence_length == 96
    assert EngineSettings(sequence_length=8).resolve(checkpoint).sequence_length == 8


def test_server_kwargs_are_the_settings_fields(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("endpoints:\n  - model: ./m\n    kwargs: {sequence_length: lots}\n")
    with pytest.raises(ValueError, match="kwargs.sequence_length: Input should be a valid "
                                         "integer"):
        ServerConfig.load(cfg)
    cfg.write_text("endpoints:\n  - model: ./m\n    kwargs: {kv_cache_dtype: fp8}\n")
    with pytest.raises(ValueError, match="kwargs: unknown kv_cache_dtype 'fp8'"):
        ServerConfig.load(cfg)
    cfg.write_text("endpoints:\n  - model: ./m\n    kwargs: {model_path: ./other}\n")
    with pytest.raises(ValueError, match=r"unknown kwargs \['model_path'\]"):
        ServerConfig.load(cfg)
    accepted = {f.name for f in fields(EngineSettings)} - {"model_path"}
    cfg.write_text("endpoints:\n  - model: ./m\n    kwargs: {sequence_length: 64, "
                   "draft_model_path: auto, internal_kv_cache: true, top_k: 3}\n")
    endpoint = ServerConfig.load(cfg).endpoints[0]
    assert endpoint.settings == EngineSettings(model_path="./m", sequence_length=64,
                                               draft_model_path="auto")
    assert endpoint.generation_kwargs == {"top_k": 3}
    assert accepted <= set(EngineSettings.names())
