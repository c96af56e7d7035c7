"""Drafting methods for speculative decoding: each proposes tokens for a sequence and says which
distribution it drew each one from (what `accept_draft` needs to keep the output exact).

A method is one `Drafter` subclass: `start` a sequence (its prompt), `propose` up to k tokens for
a batch of sequences, hear how many were `accepted` (to roll its own state back), `release` a
finished one. Two methods: a draft model (`DraftModel`, a second Engine) and prompt lookup
(`PromptLookup`, n-gram matching against the sequence itself; deterministic, so its
distributions are one-hot), which can hand the sequences it finds no match for to another drafter.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..engine import Engine
from ..engine.settings import SELF_DRAFT, SELF_DRAFT_WEIGHTS  # declared with draft_model_path
from ..models import Checkpoint
from .sampling import Sampler


def draft_engine(draft: str | Path | Checkpoint, main: Engine, weights: str | None = None,
                 **engine_kwargs: Any) -> Engine:
    """The draft model's Engine: `draft` (a path, registry name or checkpoint) loaded, or for
    "auto" the main model's own checkpoint again in `weights` (default SELF_DRAFT_WEIGHTS):
    speculation without preparing a second model. `weights` converts any draft's weights."""
    if isinstance(draft, str) and draft == SELF_DRAFT:
        return Engine(main.checkpoint, weights=weights or SELF_DRAFT_WEIGHTS, **engine_kwargs)
    return Engine(draft, weights=weights, **engine_kwargs)


@dataclass
class DraftRequest:
    """One sequence's part of a drafting step."""

    key: Hashable  # the sequence, as given to Drafter.start
    next_token: int  # the main model's last sampled token, not yet fed anywhere
    k: int  # tokens to propose; 0: none this step (the drafter may still catch up later)
    sampler: Sampler  # the sequence's own sampling settings and random state
    history: list[int]  # prompt + output so far, ending with next_token


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)  # the drafted tokens, in order
    q: list[np.ndarray] = field(default_factory=list)  # (vocab,) distribution of each


class Drafter(ABC):
    """A drafting method. Sequences are identified by the key given to `start`."""

    @abstractmethod
    def start(self, key: Hashable, prompt_ids: list[int]) -> None:
        """A sequence with this prompt starts generating."""

    @abstractmethod
    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        """Up to `k` tokens per request (exactly k unless the method has nothing to offer)."""

    @abstractmethod
    def accepted(self, key: Hashable, n: int) -> None:
        """The main model kept the first n tokens of the sequence's last proposal."""

    @abstractmethod
    def release(self, key: Hashable) -> None:
        """The sequence finished."""

    @property
    def cost_hint(self) -> float:
        """The expected cost of a drafted token relative to a plain decode step, before any
        step is timed (speculation starts from it, then measures)."""
        return 0.25


class DraftModel(Drafter):
    """A smaller model with the same vocabulary drafts token by token, batched over sequences,
    in its own Engine (its own KV cache, one slot per sequence, trimmed on rejection). Its cache
    holds a prefix of the sequence's history; each proposal first feeds what it lacks (the
    prompt at the first one, the accepted tokens and next_token, or more after steps it sat
    out)."""

    def __init__(self, draft: Engine, main: Engine, tokenizer: Any):
        check_compatible_vocab(tokenizer, draft.checkpoint.tokenizer)
        if draft.max_sequences < main.max_sequences or \
                draft.sequence_length < main.sequence_length:
            raise ValueError("the draft engine needs at least the main engine's "
                             "max_sequences and sequence_length")
        self.engine = draft
        # A drafted token streams the draft's weights once and adds a row to the verification
        # step (a few percent of a main step at decode sizes).
        self._cost_hint = draft.model.weight_bytes / max(1, main.model.weight_bytes) + 0.05
        self._slots: dict[Hashable, int] = {}
        self._k: dict[Hashable, int] = {}  # tokens drafted by the last proposal

    def start(self, key: Hashable, prompt_ids: list[int]) -> None:
        # The prompt is fed at the first proposal, with whatever else the cache lacks: a
        # sequence that never drafts (speculation does not pay for it) never costs a prefill.
        self._slots[key] = self.engine.add_sequence()

    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        proposals = [Proposal() for _ in requests]
        for r in requests:
            self._k[r.key] = r.k
        # Step all sequences drafting this time together: first the history their cache lacks
        # (ending with next_token), then one drafted token each.
        todo = [i for i, r in enumerate(requests) if r.k]
        tokens = [requests[i].history[self.engine.length(self._slots[requests[i].key]):]
                  for i in todo]
        while todo:
            rows = np.cumsum([len(t) for t in tokens]) - 1
            logits = self.engine.step([self._slots[requests[i].key] for i in todo], tokens, rows)
            for i, row in zip(todo, logits, strict=True):
                r, p = requests[i], proposals[i]
                q = r.sampler.distribution(row, r.history + p.tokens)
                p.tokens.append(r.sampler.draw(q))
                p.q.append(q)
            todo = [i for i in todo if len(proposals[i].tokens) < requests[i].k]
            tokens = [[proposals[i].tokens[-1]] for i in todo]
        return proposals

    def accepted(self, key: Hashable, n: int) -> None:
        k = self._k.pop(key, 0)
        if k:  # the cache holds the history, then the first k - 1 drafted tokens: keep n of them
            slot = self._slots[key]
            self.engine.trim(slot, self.engine.length(slot) - (k - 1) + min(n, k - 1))

    def release(self, key: Hashable) -> None:
        self.engine.release(self._slots.pop(key))
        self._k.pop(key, None)

    @property
    def cost_hint(self) -> float:
        return self._cost_hint


def lookup_continuation(tokens: list[int], k: int, max_ngram: int = 3,
                        min_ngram: int = 1) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the sequence's last
    n tokens, for the longest n in [min_ngram, max_ngram] that occurs earlier; [] if none does.

    A match may overlap the end (a repeating pattern): the continuation then runs on into the
    tokens it has just proposed, i.e. the pattern repeats.
    """
    if k <= 0 or len(tokens) < 2:
        return []
    seq = np.asarray(tokens)
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        # windows (len - n, n): every n-gram starting before the last one
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
        starts = np.flatnonzero((windows == seq[-n:]).all(axis=1))
        if len(starts):
            out = list(tokens)
            for j in range(int(starts[-1]) + n, int(starts[-1]) + n + k):
                out.append(out[j])  # j < len(out): the match starts before the last n-gram
            return out[len(tokens):]
    return []


class PromptLookup(Drafter):
    """Prompt-lookup decoding (n-gram drafting): propose the tokens that followed the most recent
    earlier occurrence of the sequence's last tokens in its prompt and output
    (`lookup_continuation`). No model, nearly free, strong where the output copies the input
    (editing code, summaries, RAG answers). Proposals are deterministic, so each comes with a
    one-hot distribution. Sequences with no match get nothing, or the `fallback` drafter's
    proposal (e.g. a `DraftModel`)."""

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1,
                 fallback: Drafter | None = None):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.vocab_size = vocab_size
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.fallback = fallback
        self._looked_up: dict[Hashable, bool] = {}  # did the last proposal come from lookup

    @property
    def cost_hint(self) -> float:
        """Looking up is nearly free (a drafted token costs its verification row); where
        nothing matches the fallback drafts, at its own cost."""
        return 0.05 if self.fallback is None else self.fallback.cost_hint

    def start(self, key: Hashable, prompt_ids: list[int]) -> None:
        if self.fallback is not None:
            self.fallback.start(key, prompt_ids)

    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        found = [lookup_continuation(r.history, r.k, self.max_ngram, self.min_ngram)
                 for r in requests]
        for r, tokens in zip(requests, found, strict=True):
            self._looked_up[r.key] = bool(tokens)
        if self.fallback is not None:  # asked for every sequence, so it can keep up with each
            rest = self.fallback.propose([replace(r, k=0) if tokens else r
                                          for r, tokens in zip(requests, found, strict=True)])
        else:
            rest = [Proposal() for _ in requests]
        return [Proposal(tokens, [self._one_hot(t) for t in tokens]) if tokens else other
                for tokens, other in zip(found, rest, strict=True)]

    def _one_hot(self, token: int) -> np.ndarray:
        q = np.zeros(self.vocab_size)
        q[token] = 1.0
        return q

    def accepted(self, key: Hashable, n: int) -> None:
        looked_up = self._looked_up.pop(key, False)
        if self.fallback is not None:
            self.fallback.accepted(key, 0 if looked_up else n)

    def release(self, key: Hashable) -> None:
        self._looked_up.pop(key, None)
        if self.fallback is not None:
            self.fallback.release(key)


def check_compatible_vocab(main_tokenizer: object, draft_tokenizer: object) -> None:
    """A draft must speak the main model's token ids, or its proposals are meaningless."""
    a, b = main_tokenizer.get_vocab(), draft_tokenizer.get_vocab()  # type: ignore[attr-defined]
    if a != b:
        only_main = len(set(a.items()) - set(b.items()))
        raise ValueError(
            f"the draft model's vocabulary differs from the main model's ({len(b)} vs {len(a)} "
            f"tokens, {only_main} main-model entries missing or renumbered); speculative "
            "decoding needs a draft with the same tokenizer (e.g. a compressed copy of the main "
            "model)"
        )
