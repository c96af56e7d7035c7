"""Speculative decoding: a draft model proposes tokens, the main model checks them in one step.

The acceptance rule is speculative sampling (Leviathan et al. 2023; Chen et al. 2023): accept a
drafted token d with probability min(1, p(d)/q(d)); on the first rejection draw from the residual
max(0, p - q), normalized; if all are accepted draw one more token from p. The emitted tokens are
then distributed exactly as if sampled from the main model alone. With greedy decoding p and q are
one-hot, so this reduces to "accept the longest prefix on which the argmaxes agree, then take the
main model's token" and the output is identical to plain greedy decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sampling import draw


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
