"""Speculative decoding: a drafting method proposes tokens, the main model checks them in one step.

The acceptance rule is speculative sampling (Leviathan et al. 2023; Chen et al. 2023): accept a
drafted token d with probability min(1, p(d)/q(d)); on the first rejection draw from the residual
max(0, p - q), normalized; if all are accepted draw one more token from p. The emitted tokens are
then distributed exactly as if sampled from the main model alone. With greedy decoding p and q are
one-hot, so this reduces to "accept the longest prefix on which the argmaxes agree, then take the
main model's token" and the output is identical to plain greedy decoding.

`Speculator` runs one speculative decode step for a batch of sequences: proposal (a `Drafter`,
drafters.py), verification (one main-engine step over every proposal), acceptance
(`accept_draft`), rollback of both caches, and control of each sequence's draft length
(`DraftLength`: from its measured acceptance rate and the measured cost of a drafted token).
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from ..engine import Engine
from .drafters import Drafter, DraftModel, DraftRequest, PromptLookup, check_compatible_vocab
from .sampling import Sampler, draw

__all__ = ["DraftLength", "SpeculationStats", "SpeculativeSequence", "Speculator", "Verified",
           "accept_draft", "best_draft_length", "check_compatible_vocab", "speculator_for"]


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


def best_draft_length(acceptance: float, cost_ratio: float, max_k: int) -> int:
    """The k in [0, max_k] with the most tokens per unit of time, drafting k tokens per step.

    Each drafted token is accepted with probability `acceptance` (independently, once the
    previous one was), so a step yields (1 - a^(k+1)) / (1 - a) tokens in expectation; it costs
    1 + cost_ratio * k plain decode steps (drafting one token and verifying it one more position).
    k = 0 is plain decoding.
    """
    a = min(max(acceptance, 0.0), 1.0)

    def rate(k: int) -> float:
        tokens = k + 1 if a == 1.0 else (1 - a ** (k + 1)) / (1 - a)
        return tokens / (1 + cost_ratio * k)

    return max(range(max_k + 1), key=lambda k: (rate(k), -k))  # ties: the shorter draft


@dataclass
class _Acceptance:
    """Decayed counts of one sequence's accepted and rejected drafted tokens."""

    accepted: float
    rejected: float
    idle: int = 0  # steps since it last drafted
    probe_every: int = 4  # steps between one-token probes while it drafts nothing

    @property
    def rate(self) -> float:
        return self.accepted / (self.accepted + self.rejected)


@dataclass
class _StepCost:
    """Least-squares line through (drafted tokens per sequence, seconds per sequence) of recent
    steps, with exponential forgetting: intercept = a plain decode step, slope = one drafted
    token (drafting it and verifying it)."""

    decay: float = 0.95
    sums: np.ndarray = field(default_factory=lambda: np.zeros(5))  # w, x, y, xx, xy

    def add(self, x: float, y: float) -> None:
        self.sums = self.decay * self.sums + np.array([1.0, x, y, x * x, x * y])

    def ratio(self) -> float | None:
        """slope / intercept, or None while the recent steps do not pin the line down."""
        w, sx, sy, sxx, sxy = self.sums
        if w < 4:
            return None
        var = sxx / w - (sx / w) ** 2
        if var < 0.05:  # (almost) one draft length only: the slope is unknown
            return None
        slope = (sxy / w - sx / w * sy / w) / var
        intercept = sy / w - slope * sx / w
        if intercept <= 0:
            return None
        return float(np.clip(slope / intercept, 0.01, 10.0))


class DraftLength:
    """How many tokens each sequence drafts next step, from its measured acceptance rate and the
    cost of a drafted token relative to a plain decode step (`best_draft_length`).

    The acceptance rate is a decayed count of accepted and rejected drafted tokens per sequence
    (`decay` per step, starting from an optimistic prior). The cost ratio is `cost_ratio` if
    given, else measured from the speculative steps' wall times (`_StepCost`), `prior_cost_ratio`
    until they vary enough to tell. A sequence at k = 0 decodes plainly and drafts one token every
    few steps (the interval doubling up to `max_probe_every` while probes fail), so it can come
    back when drafting starts paying again. With a measured cost ratio k depends on timings: a
    seeded sampled output is then reproducible only with a fixed `cost_ratio` (greedy output
    never depends on k).
    """

    def __init__(self, max_k: int, cost_ratio: float | None = None,
                 prior_cost_ratio: float = 0.25, decay: float = 0.9,
                 prior: tuple[float, float] = (1.6, 0.4), max_probe_every: int = 32,
                 explore_every: int = 8):
        self.max_k = max_k
        self.cost_ratio = cost_ratio
        self.measured_cost_ratio = prior_cost_ratio
        self.decay, self.prior, self.max_probe_every = decay, prior, max_probe_every
        self.explore_every = explore_every
        self.cost = _StepCost()
        self._seqs: dict[Hashable, _Acceptance] = {}
        self._steps = 0
        self.exploring = False  # this step decodes plainly to measure the cost (new_step)

    def start(self, key: Hashable) -> None:
        self._seqs[key] = _Acceptance(*self.prior)

    def release(self, key: Hashable) -> None:
        self._seqs.pop(key, None)

    @property
    def ratio(self) -> float:
        return self.cost_ratio if self.cost_ratio is not None else self.measured_cost_ratio

    def new_step(self) -> None:
        """A decode step begins (the draft lengths asked next are this step's). While the
        recent steps cannot tell the cost ratio (they all drafted alike, e.g. always max_k),
        one step in `explore_every` drafts nothing, so the cost fit sees plain steps too."""
        self._steps += 1
        self.exploring = self.cost_ratio is None and self._steps % self.explore_every == 0 \
            and self.cost.ratio() is None

    def next(self, key: Hashable) -> int:
        if self.exploring:
            return 0
        s = self._seqs[key]
        k = best_draft_length(s.rate, self.ratio, self.max_k)
        # At k = 0, probe with one drafted token every few steps, so the sequence comes back
        # when drafting pays again; only every 8 x max_probe_every steps (to re-measure the
        # cost) if drafting could not pay at this cost even were every drafted token accepted:
        # a probe then costs several decode steps (the draft catches up on the steps it sat
        # out) for nothing.
        could_pay = best_draft_length(1.0, self.ratio, self.max_k) > 0
        every = s.probe_every if could_pay else 8 * self.max_probe_every
        if k == 0 and s.idle + 1 >= every:
            return 1
        return k

    def observe(self, key: Hashable, drafted: int, accepted: int) -> None:
        """The sequence drafted `drafted` tokens this step and the main model kept `accepted`."""
        s = self._seqs[key]
        if not drafted:
            s.idle += 1
            return
        if best_draft_length(s.rate, self.ratio, self.max_k) == 0:  # this was a probe
            s.probe_every = 4 if accepted else min(2 * s.probe_every, self.max_probe_every)
        s.idle = 0
        s.accepted = self.decay * s.accepted + accepted
        s.rejected = self.decay * s.rejected + (accepted < drafted)

    def step_time(self, sequences: int, drafted: int, seconds: float) -> None:
        """One decode step of `sequences` sequences that drafted `drafted` tokens in all (0: a
        plain step), drafting and verification included."""
        self.cost.add(drafted / sequences, seconds / sequences)
        ratio = self.cost.ratio()
        if ratio is not None:
            self.measured_cost_ratio = ratio


class Speculator:
    """Speculative decoding over a `Drafter`. With `adaptive` (the default) each sequence drafts
    between 0 and `num_speculative_tokens` tokens per step, as `DraftLength` finds pays (0:
    plain decoding; `cost_ratio` fixes the cost of a drafted token relative to a decode step
    instead of measuring it); without, always `num_speculative_tokens`."""

    def __init__(self, drafter: Drafter, num_speculative_tokens: int = 4,
                 adaptive: bool = True, cost_ratio: float | None = None):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.drafter = drafter
        self.num_speculative_tokens = num_speculative_tokens
        self.adaptive = adaptive
        self.length = DraftLength(num_speculative_tokens, cost_ratio,
                                  prior_cost_ratio=drafter.cost_hint)
        self.stats = SpeculationStats()
        self._live: set[Hashable] = set()
        self._planned: dict[Hashable, int] = {}  # this step's draft lengths (drafts)

    def start(self, key: Hashable, prompt_ids: list[int]) -> None:
        self._live.add(key)
        self.length.start(key)
        self.drafter.start(key, prompt_ids)

    def release(self, key: Hashable) -> None:
        if key in self._live:
            self._live.remove(key)
            self.length.release(key)
            self.drafter.release(key)

    def draft_length(self, key: Hashable) -> int:
        """Tokens the sequence would draft next step (before its room limits them)."""
        return self.length.next(key) if self.adaptive else self.num_speculative_tokens

    def drafts(self, keys: list[Hashable]) -> bool:
        """A decode step begins: whether any of these sequences drafts in it (`step` then
        drafts the lengths found here). If none does, the caller decodes plainly (no
        speculative overhead) and reports `decoded_plainly`."""
        self.length.new_step()
        self._planned = {key: self.draft_length(key) for key in keys}
        return any(self._planned.values())

    def decoded_plainly(self, keys: list[Hashable], seconds: float) -> None:
        """These sequences took one plain decode step, in `seconds`."""
        for key in keys:
            self.length.observe(key, 0, 0)
        self.length.step_time(len(keys), 0, seconds)

    def step(self, engine: Engine, seqs: list[SpeculativeSequence]) -> list[Verified] | None:
        """Draft for every sequence (the lengths `drafts` found for this step), verify all
        proposals in one `engine` step (every row scored), accept, and trim both caches to
        what was kept. None if no sequence got a proposal (e.g. prompt lookup found no match):
        the caller then decodes plainly, at a plain step's cost, and reports `decoded_plainly`."""
        began = time.perf_counter()
        ks = [max(0, min(self._planned[s.key], s.room)) for s in seqs]
        proposals = self.drafter.propose([
            DraftRequest(s.key, s.next_token, k, s.sampler, s.history)
            for s, k in zip(seqs, ks, strict=True)])
        if not any(p.tokens for p in proposals):
            for s in seqs:
                self.drafter.accepted(s.key, 0)
            return None
        verify = [[s.next_token] + p.tokens for s, p in zip(seqs, proposals, strict=True)]
        lengths = [engine.length(s.slot) for s in seqs]
        logits = engine.step([s.slot for s in seqs], verify,
                             np.arange(sum(len(v) for v in verify)))
        self.length.step_time(len(seqs), sum(len(p.tokens) for p in proposals),
                              time.perf_counter() - began)
        out, offset = [], 0
        for s, prop, length, fed in zip(seqs, proposals, lengths, verify, strict=True):
            rows = logits[offset:offset + len(fed)]
            offset += len(fed)
            p = np.stack([s.sampler.distribution(rows[j], s.history + prop.tokens[:j])
                          for j in range(len(rows))])
            n, nxt = accept_draft(p, np.asarray(prop.q), prop.tokens, s.sampler.rng)
            if prop.tokens:
                self.stats.steps += 1
                self.stats.proposed += len(prop.tokens)
                self.stats.accepted += n
            self.length.observe(s.key, len(prop.tokens), n)
            self.drafter.accepted(s.key, n)
            engine.trim(s.slot, length + 1 + n)
            out.append(Verified(prop.tokens[:n] + [nxt], rows))
        return out


def speculator_for(engine: Engine, tokenizer: object, draft: Engine | None = None,
                   prompt_lookup: bool = False, num_speculative_tokens: int = 4,
                   adaptive: bool = True) -> Speculator | None:
    """The speculator for a `draft` engine and/or prompt lookup (lookup first, the draft where
    lookup finds nothing); None for neither (plain decoding)."""
    drafter: Drafter | None = None
    if draft is not None:
        drafter = DraftModel(draft, engine, tokenizer)
    if prompt_lookup:
        drafter = PromptLookup(engine.vocab_size, fallback=drafter)
    return None if drafter is None else Speculator(drafter, num_speculative_tokens, adaptive)
