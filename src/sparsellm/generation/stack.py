"""The assembly point: `EngineSettings` -> checkpoint -> Engine -> draft Engine -> Speculator ->
BatchGenerator. `TextGeneration`, the benchmarks and evaluation build what they run here (the
server, batch, the Ray app and `sparsellm generate` through `TextGeneration`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine import Engine, EngineSettings
from ..models import Checkpoint, load_checkpoint
from .drafters import draft_engine as load_draft_engine
from .generator import BatchGenerator
from .speculative import Speculator, speculator_for


@dataclass
class Stack:
    """A model ready to generate, and the settings it was built from."""

    settings: EngineSettings  # resolved: sequence_length is set
    checkpoint: Checkpoint
    engine: Engine
    draft_engine: Engine | None  # with a draft model (draft_model_path)
    generator: BatchGenerator

    @property
    def speculator(self) -> Speculator | None:
        return self.generator.speculator


def build_stack(settings: EngineSettings, checkpoint: Checkpoint | None = None, *,
                engine: Engine | None = None, draft_engine: Engine | None = None) -> Stack:
    """Build what `settings` describe: the checkpoint (`checkpoint`, else
    `settings.model_path` loaded), its Engine, the draft model's Engine (draft_model_path; its
    engine shares the settings marked `draft`), the Speculator (the draft and/or prompt
    lookup) and the BatchGenerator that drives them.

    `engine` / `draft_engine`: reuse engines already built (several generators over one
    model, as the speculation benchmark compares them); the settings then take the engine's
    sequence_length and batch size.
    """
    if engine is not None:
        checkpoint = engine.checkpoint
        settings = settings.replace(sequence_length=engine.sequence_length,
                                    batch_size=engine.max_sequences)
    elif checkpoint is None:
        model = settings.model_path
        checkpoint = model if isinstance(model, Checkpoint) else load_checkpoint(model)
    settings = settings.resolve(checkpoint)
    if engine is None:
        engine = Engine(checkpoint, **settings.engine_kwargs())
    if draft_engine is None and settings.draft_model_path is not None:
        draft_engine = load_draft_engine(settings.draft_model_path, engine,
                                         settings.draft_weights,
                                         **settings.engine_kwargs(draft=True))
    speculator = speculator_for(engine, checkpoint.tokenizer, draft_engine,
                                settings.prompt_lookup, settings.num_speculative_tokens,
                                settings.adaptive_speculation)
    generator = BatchGenerator(engine, checkpoint.tokenizer, checkpoint.eos_token_ids,
                               speculator=speculator)
    return Stack(settings, checkpoint, engine, draft_engine, generator)
