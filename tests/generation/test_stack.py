"""build_stack, the one assembly point: settings -> checkpoint -> Engine -> draft Engine ->
Speculator -> BatchGenerator; and nothing else in the package assembles one."""

from __future__ import annotations

import ast
from pathlib import Path

from sparsellm.engine import EngineSettings
from sparsellm.generation import GenerationConfig, GenerationRequest, build_stack
from sparsellm.generation.drafters import DraftModel, PromptLookup
from sparsellm.models import load_checkpoint

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "sparsellm"


def _calls(name: str) -> set[str]:
    """The package modules (paths under src/sparsellm) that call `name(...)`."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == name:
                found.add(str(path.relative_to(PACKAGE)))
    return found


def test_the_stack_is_assembled_in_one_place():
    assert _calls("BatchGenerator") == {"generation/stack.py"}
    # engines: the model's in build_stack, a draft model's in drafters.draft_engine (which
    # build_stack calls); perplexity, the benchmarks and the pipeline take build_stack's
    assert _calls("Engine") == {"generation/stack.py", "generation/drafters.py"}
    # the speculator: build_stack, and BatchGenerator(draft=) for a caller holding engines
    assert _calls("speculator_for") == {"generation/stack.py", "generation/generator.py"}


def test_build_stack_builds_what_the_settings_say(tiny_llama_dir):
    checkpoint = load_checkpoint(tiny_llama_dir)
    settings = EngineSettings(model_path=tiny_llama_dir, sequence_length=48, batch_size=2,
                              kv_cache_dtype="fp16", draft_model_path="auto",
                              prompt_lookup=True, num_speculative_tokens=3,
                              adaptive_speculation=False)
    stack = build_stack(settings)
    assert stack.settings == settings
    engine, draft = stack.engine, stack.draft_engine
    assert (engine.sequence_length, engine.max_sequences, engine.kv_cache_dtype) == (48, 2, "fp16")
    assert (draft.sequence_length, draft.max_sequences, draft.kv_cache_dtype) == (48, 2, "fp16")
    assert set(draft.formats.values()) >= {"int8_a8"}  # "auto": the model itself in int8_a8
    speculator = stack.speculator
    assert (speculator.num_speculative_tokens, speculator.adaptive) == (3, False)
    # prompt lookup first, the draft model where lookup finds nothing
    assert isinstance(speculator.drafter, PromptLookup)
    assert isinstance(speculator.drafter.fallback, DraftModel)
    assert stack.generator.engine is engine and stack.speculator is stack.generator.speculator

    # a second stack over the same engine: plain decoding, the same tokens
    plain = build_stack(EngineSettings(), engine=engine)
    assert plain.engine is engine and plain.checkpoint is engine.checkpoint
    assert plain.speculator is None and plain.draft_engine is None
    assert plain.settings.sequence_length == 48 and plain.settings.batch_size == 2
    config = GenerationConfig(max_generated_tokens=8, force_max_tokens=True)
    prompt = checkpoint.tokenizer.encode("def f(x):")
    outputs = [s.generator.run([GenerationRequest(prompt, config)])[0].output_ids
               for s in (plain, stack)]
    assert outputs[0] == outputs[1] and len(outputs[0]) == 8
    # a given checkpoint is used as it is; the sequence length defaults to 1024
    assert build_stack(EngineSettings(), checkpoint).engine.sequence_length == 1024
