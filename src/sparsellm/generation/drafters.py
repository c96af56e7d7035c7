"""Drafting methods for speculative decoding: each proposes tokens for a sequence and says which
distribution it drew each one from (what `accept_draft` needs to keep the output exact).

A method is one `Drafter` subclass: `start` a sequence (its prompt), `propose` up to k tokens for
a batch of sequences, hear how many were `accepted` (to roll its own state back), `release` a
finished one. The only method today is a draft model (`DraftModel`, a second Engine); a
deterministic proposer such as prompt lookup would return one-hot distributions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..engine import Engine
from .sampling import Sampler


@dataclass
class DraftRequest:
    """One sequence's part of a drafting step."""

    key: Hashable  # the sequence, as given to Drafter.start
    next_token: int  # the main model's last sampled token, not yet fed anywhere
    k: int  # tokens to propose; 0: none this step (the drafter may still catch up later)
    sampler: Sampler  # the sequence's own sampling settings and random state
    history: list[int]  # prompt + output so far (repetition penalty)


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


class DraftModel(Drafter):
    """A smaller model with the same vocabulary drafts token by token, batched over sequences,
    in its own Engine (its own KV cache, one slot per sequence, trimmed on rejection)."""

    def __init__(self, draft: Engine, main: Engine, tokenizer: Any):
        check_compatible_vocab(tokenizer, draft.checkpoint.tokenizer)
        if draft.max_sequences < main.max_sequences or \
                draft.sequence_length < main.sequence_length:
            raise ValueError("the draft engine needs at least the main engine's "
                             "max_sequences and sequence_length")
        self.engine = draft
        self._slots: dict[Hashable, int] = {}
        self._behind: dict[Hashable, list[int]] = {}  # accepted tokens not fed to the draft yet
        self._last: dict[Hashable, tuple[int, int, list[int]]] = {}  # (fed, k, tokens) proposed

    def start(self, key: Hashable, prompt_ids: list[int]) -> None:
        slot = self._slots[key] = self.engine.add_sequence()
        self._behind[key] = []
        self.engine.prefill(slot, prompt_ids)

    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        feeds = [self._behind[r.key] + [r.next_token] for r in requests]
        proposals = [Proposal() for _ in requests]
        for r, feed, p in zip(requests, feeds, proposals, strict=True):
            self._behind[r.key] = [] if r.k else feed  # k == 0: catch up at the next proposal
            self._last[r.key] = (len(feed), r.k, p.tokens)
        # Step all sequences still drafting together: first their catch-up tokens + next_token,
        # then one drafted token each.
        todo = [i for i, r in enumerate(requests) if r.k]
        tokens = [feeds[i] for i in todo]
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
        feed, k, tokens = self._last.pop(key)
        if not k:
            return
        # The draft was fed feed + tokens[:-1]; keep what was accepted.
        slot = self._slots[key]
        if n < k:
            fed = feed + k - 1
            self.engine.trim(slot, self.engine.length(slot) - fed + feed + n)
        else:
            self._behind[key] = [tokens[-1]]

    def release(self, key: Hashable) -> None:
        self.engine.release(self._slots.pop(key))
        del self._behind[key]
        self._last.pop(key, None)


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
