"""Speculative decoding: a drafting method proposes tokens, the main model checks them in one step.

The acceptance rule is speculative sampling (Leviathan et al. 2023; Chen et al. 2023): accept a
drafted token d with probability min(1, p(d)/q(d)); on the first rejection draw from the residual
max(0, p - q), normalized; if all are accepted draw one more token from p. The emitted tokens are
then distributed exactly as if sampled from the main model alone. With greedy decoding p and q are
one-hot, so this reduces to "accept the longest prefix on which the argmaxes agree, then take the
main model's token" and the output is identical to plain greedy decoding.

`Speculator` runs one speculative decode step for a batch of sequences: proposal (a `Drafter`,
drafters.py), verification (one main-engine step over every proposal), acceptance
(`accept_draft`), rollback of both caches, and adaptive control of each sequence's draft length.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from ..engine import Engine
from .drafters import Drafter, DraftRequest, check_compatible_vocab
from .sampling import Sampler, draw

__all__ = ["SpeculationStats", "SpeculativeSequence", "Speculator", "Verified", "accept_draft",
           "check_compatible_vocab"]


@dataclass
class SpeculationStats:
    steps: int = 0  # verification steps
    proposed: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens emitted per verification step (accepted + the main model's own)."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0


def accept_draft(
    p: np.ndarray, q: np.ndarray, draft: list[int], rng: np.random.Generator
) -> tuple[int, int]:
    """Decide how many drafted tokens to keep and which token follows them.

    p: (k+1, vocab) main-model probabilities at each drafted position and one past the last;
    q: (k, vocab) draft probabilities the drafted tokens were drawn from; draft: the k tokens.
    Returns (number accepted, next token).
    """
    for i, d in enumerate(draft):
        if q[i, d] > 0 and rng.random() * q[i, d] < p[i, d]:  # accept w.p. min(1, p/q)
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        total = residual.sum()
        dist = residual / total if total > 0 else p[i]
        return i, draw(dist, rng)
    return len(draft), draw(p[len(draft)], rng)


@dataclass
class SpeculativeSequence:
    """One decoding sequence as the speculator sees it."""

    key: Hashable  # as given to Speculator.start
    slot: int  # its main-engine KV-cache slot
    next_token: int  # sampled from the main model, not yet fed
    room: int  # most tokens it may draft (its token budget and main-cache room, minus one)
    sampler: Sampler
    history: list[int]  # prompt + output so far


@dataclass
class Verified:
    """What one sequence keeps from a speculative step."""

    tokens: list[int]  # accepted drafted tokens, then the main model's own
    logits: np.ndarray  # (>= len(tokens), vocab) main-model rows: row j chose tokens[j]


class Speculator:
    """Speculative decoding over a `Drafter`. Each sequence drafts `num_speculative_tokens`
    tokens per step; `adaptive` makes that a maximum: one fewer after a step with a rejection
    (down to 1), one more after a step that accepted everything."""

    def __init__(self, drafter: Drafter, num_speculative_tokens: int = 4,
                 adaptive: bool = False):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.drafter = drafter
        self.num_speculative_tokens = num_speculative_tokens
        self.adaptive = adaptive
        self.stats = SpeculationStats()
        self._k: dict[Hashable, int] = {}  # tokens each sequence drafts next step

    def start(self, key: Hashable, prompt_ids: list[int]) -> None:
        self._k[key] = self.num_speculative_tokens
        self.drafter.start(key, prompt_ids)

    def release(self, key: Hashable) -> None:
        if self._k.pop(key, None) is not None:
            self.drafter.release(key)

    def step(self, engine: Engine, seqs: list[SpeculativeSequence]) -> list[Verified]:
        """Draft for every sequence, verify all proposals in one `engine` step (every row
        scored), accept, and trim both caches to what was kept."""
        ks = [max(0, min(self._k[s.key], s.room)) for s in seqs]
        proposals = self.drafter.propose([
            DraftRequest(s.key, s.next_token, k, s.sampler, s.history)
            for s, k in zip(seqs, ks, strict=True)])
        verify = [[s.next_token] + p.tokens for s, p in zip(seqs, proposals, strict=True)]
        lengths = [engine.length(s.slot) for s in seqs]
        logits = engine.step([s.slot for s in seqs], verify,
                             np.arange(sum(len(v) for v in verify)))
        out, offset = [], 0
        for s, k, prop, length, fed in zip(seqs, ks, proposals, lengths, verify, strict=True):
            rows = logits[offset:offset + len(fed)]
            offset += len(fed)
            p = np.stack([s.sampler.distribution(rows[j], s.history + prop.tokens[:j])
                          for j in range(len(rows))])
            n, nxt = accept_draft(p, np.asarray(prop.q), prop.tokens, s.sampler.rng)
            if k:
                self.stats.steps += 1
                self.stats.proposed += k
                self.stats.accepted += n
                if self.adaptive:
                    self._k[s.key] = min(self._k[s.key] + 1, self.num_speculative_tokens) \
                        if n == k else max(self._k[s.key] - 1, 1)
            self.drafter.accepted(s.key, n)
            engine.trim(s.slot, length + 1 + n)
            out.append(Verified(prop.tokens[:n] + [nxt], rows))
        return out
