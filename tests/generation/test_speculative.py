"""Speculative decoding: greedy output identical to plain decoding, sampling distribution exact."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from sparsellm import Pipeline
from sparsellm.engine import Engine
from sparsellm.generation import BatchGenerator, GenerationConfig, GenerationRequest
from sparsellm.generation.drafters import Drafter, Proposal
from sparsellm.generation.sampling import make_distribution
from sparsellm.generation.speculative import (
    DraftLength,
    SpeculationStats,
    Speculator,
    accept_draft,
    best_draft_length,
    check_compatible_vocab,
)
from sparsellm.models import load_checkpoint

PROMPTS = [
    "def fibonacci(n):", "import os\n", "Hello world", "class Foo:", "# comment\n",
    "0123456789", "return x + y", "for i in range(10):", "The quick brown fox", "while True:",
    "x = [1, 2, 3]", "if a and b:", "print('hi')", "with open(p) as f:", "lambda x: x * 2",
    "try:\n    pass", "def __init__(self):", "s = 'text'", "from json import", "yield from",
]


def _perturbed(checkpoint, scale: float, seed: int = 0):
    """A draft that mostly agrees with `checkpoint`: its weights plus relative noise."""
    rng = np.random.default_rng(seed)
    return checkpoint.with_tensors({
        k: v + rng.normal(0, scale * float(np.abs(v).mean()), v.shape).astype(np.float32)
        if v.ndim == 2 else v
        for k, v in checkpoint.tensors.items()
    })


def _random_dist(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    p = rng.dirichlet(np.full(vocab, 0.5), size=n)
    return p


def test_accept_draft_first_token_follows_main_distribution():
    """The emitted token at the first drafted position is distributed exactly as p[0]."""
    rng = np.random.default_rng(0)
    vocab, draws = 6, 20000
    p = _random_dist(rng, 3, vocab)
    q = _random_dist(rng, 2, vocab)
    counts = np.zeros(vocab)
    for _ in range(draws):
        draft = [int(rng.choice(vocab, p=q[0])), int(rng.choice(vocab, p=q[1]))]
        n, nxt = accept_draft(p, q, draft, rng)
        counts[draft[0] if n >= 1 else nxt] += 1
    assert stats.chisquare(counts, p[0] * draws).pvalue > 1e-3


def test_accept_draft_greedy_is_longest_agreeing_prefix():
    rng = np.random.default_rng(0)
    onehot = np.eye(5)
    p = onehot[[1, 2, 3, 4]]  # main argmax at each position
    q = onehot[[1, 2, 0]]
    assert accept_draft(p, q, [1, 2, 0], rng) == (2, 3)
    assert accept_draft(p, onehot[[1, 2, 3]], [1, 2, 3], rng) == (3, 4)
    assert accept_draft(p, onehot[[0, 2, 3]], [0, 2, 3], rng) == (0, 1)


@pytest.fixture(scope="module")
def main_and_draft(tiny_model_dir):
    main = load_checkpoint(tiny_model_dir("llama"))
    # Same tokenizer, different weights: a poor draft that exercises every rejection path.
    draft = load_checkpoint(tiny_model_dir("llama_tied"))
    return main, draft


def _run(checkpoint, prompts, config, draft=None, k=4, batch=4, weights=None, adaptive=False):
    engine = Engine(checkpoint, sequence_length=256, max_sequences=batch, weights=weights)
    draft_engine = Engine(draft, sequence_length=256, max_sequences=batch,
                          weights=weights) if draft else None
    gen = BatchGenerator(engine, checkpoint.tokenizer, checkpoint.eos_token_ids,
                         draft=draft_engine, num_speculative_tokens=k,
                         adaptive_speculation=adaptive)
    reqs = [GenerationRequest(checkpoint.tokenizer.encode(p), config) for p in prompts]
    return gen.run(reqs), gen.speculation


class _RepeatDrafter(Drafter):
    """A deterministic drafting method (one-hot distributions, like prompt lookup would give):
    k copies of the last token."""

    def __init__(self, vocab: int):
        self.eye = np.eye(vocab)
        self.live: set = set()
        self.kept: list[int] = []

    def start(self, key, prompt_ids):
        self.live.add(key)

    def propose(self, requests):
        return [Proposal([r.next_token] * r.k, [self.eye[r.next_token]] * r.k) for r in requests]

    def accepted(self, key, n):
        self.kept.append(n)

    def release(self, key):
        self.live.remove(key)


def test_a_drafting_method_is_one_small_class(main_and_draft):
    """Any Drafter plugs into the generator through a Speculator; greedy output stays plain's."""
    main, _ = main_and_draft
    config = GenerationConfig(max_generated_tokens=48, force_max_tokens=True)
    plain, _ = _run(main, PROMPTS[:6], config)
    engine = Engine(main, sequence_length=256, max_sequences=4)
    drafter = _RepeatDrafter(engine.vocab_size)
    gen = BatchGenerator(engine, main.tokenizer, main.eos_token_ids,
                         speculator=Speculator(drafter, num_speculative_tokens=3))
    reqs = gen.run([GenerationRequest(main.tokenizer.encode(p), config) for p in PROMPTS[:6]])
    assert [r.output_ids for r in reqs] == [r.output_ids for r in plain]
    assert drafter.live == set()  # every sequence released
    assert gen.speculation.proposed > 0 and sum(drafter.kept) == gen.speculation.accepted
    with pytest.raises(ValueError, match="not both"):
        BatchGenerator(engine, main.tokenizer, draft=engine, speculator=gen.speculator)


class _SometimesDrafter(_RepeatDrafter):
    """Proposes (the last token again) only on every third step; nothing otherwise, as prompt
    lookup does where it finds no match."""

    def __init__(self, vocab: int):
        super().__init__(vocab)
        self.calls = 0

    def propose(self, requests):
        self.calls += 1
        if self.calls % 3:
            return [Proposal() for _ in requests]
        return super().propose(requests)


def test_a_step_with_nothing_proposed_decodes_plainly(main_and_draft):
    """No verification step when no sequence got a proposal: the engine decodes one token per
    sequence (decode_step), and the output stays plain decode's."""
    main, _ = main_and_draft
    config = GenerationConfig(max_generated_tokens=30, force_max_tokens=True)
    plain, _ = _run(main, PROMPTS[:3], config)
    engine = Engine(main, sequence_length=256, max_sequences=4)
    drafter = _SometimesDrafter(engine.vocab_size)
    gen = BatchGenerator(engine, main.tokenizer, main.eos_token_ids,
                         speculator=Speculator(drafter, num_speculative_tokens=2, adaptive=False))
    calls = {"decode_step": 0, "step": 0}
    for name in calls:
        method = getattr(engine, name)

        def counted(*args, _method=method, _name=name, **kwargs):
            calls[_name] += 1
            return _method(*args, **kwargs)
        setattr(engine, name, counted)
    reqs = gen.run([GenerationRequest(main.tokenizer.encode(p), config) for p in PROMPTS[:3]])
    assert [r.output_ids for r in reqs] == [r.output_ids for r in plain]
    # every step asked the drafter; two in three proposed nothing and decoded plainly
    assert calls["decode_step"] == drafter.calls - drafter.calls // 3 > 0
    # at most one verification per sequence on the steps that proposed (fewer at the end,
    # when a sequence has no room left to draft)
    assert 0 < gen.speculation.steps <= 3 * (drafter.calls // 3)
    # the drafter hears "0 kept" after an empty proposal too
    assert len(drafter.kept) > gen.speculation.steps


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_speculative_equals_plain(main_and_draft, k):
    main, draft = main_and_draft
    config = GenerationConfig(max_generated_tokens=128, force_max_tokens=True)
    plain, _ = _run(main, PROMPTS, config)
    spec, st = _run(main, PROMPTS, config, draft=draft, k=k)
    for a, b in zip(plain, spec, strict=True):
        assert a.output_ids == b.output_ids
        assert a.text == b.text
    # drafting ran: every step proposed (up to) k tokens, and the poor draft was right sometimes
    assert st.steps > 0 and st.proposed > st.steps * (k - 1) and 0 < st.accepted < st.proposed
    # with the model itself as the draft, the same output comes from accepted drafts
    same, st_self = _run(main, PROMPTS[:4], config, draft=main, k=k)
    assert [r.output_ids for r in same] == [r.output_ids for r in plain[:4]]
    assert st_self.accepted > 0 and st_self.acceptance_rate > 0.99


def test_adaptive_speculation_shrinks_for_a_poor_draft_and_keeps_the_output(main_and_draft):
    main, draft = main_and_draft
    config = GenerationConfig(max_generated_tokens=64, force_max_tokens=True)
    plain, _ = _run(main, PROMPTS[:8], config)
    fixed, st_fixed = _run(main, PROMPTS[:8], config, draft=draft, k=6)
    adaptive, st = _run(main, PROMPTS[:8], config, draft=draft, k=6, adaptive=True)
    assert [r.output_ids for r in adaptive] == [r.output_ids for r in plain]
    # The poor draft (almost never right) drafts far less: mostly plain decoding, with probes.
    assert st.proposed < 0.1 * st_fixed.proposed


def test_draft_length_falls_to_zero_when_nothing_is_accepted_and_rises_when_all_is():
    length = DraftLength(max_k=4, cost_ratio=0.2)
    length.start("s")
    assert 0 < length.next("s") <= 4  # optimistic start
    ks = []
    for _ in range(40):  # every drafted token rejected
        k = length.next("s")
        ks.append(k)
        length.observe("s", k, 0)
    assert ks[-1] <= 1 and ks[-10:].count(0) >= 6  # plain decoding, a one-token probe now and then
    for _ in range(40):  # every drafted token accepted (the probes bring it back)
        k = length.next("s")
        ks.append(k)
        length.observe("s", k, k)
    assert ks[-5:] == [4] * 5
    assert best_draft_length(0.0, 0.2, 4) == 0 and best_draft_length(1.0, 0.2, 4) == 4
    assert best_draft_length(1.0, 1.5, 4) == 0  # a draft dearer than the model never pays
    assert best_draft_length(0.7, 0.2, 8) == 3  # (1 - .7^4) / .3 / 1.6 beats k = 2 and 4


def test_adaptive_decodes_plainly_when_the_draft_costs_as_much_as_the_model(main_and_draft):
    """A draft as large as the model (cost hint: its weight bytes over the model's, ~1) cannot
    pay even if every token were accepted: the sequences decode plainly, without speculative
    steps, and probe only every 8 x max_probe_every steps."""
    main, draft = main_and_draft
    config = GenerationConfig(max_generated_tokens=40, force_max_tokens=True)
    plain, _ = _run(main, PROMPTS[:4], config)
    spec, st = _run(main, PROMPTS[:4], config, draft=draft, adaptive=True)
    assert [r.output_ids for r in spec] == [r.output_ids for r in plain]
    assert st.proposed == 0
    length = DraftLength(4, cost_ratio=1.0)
    length.start("s")
    ks = []
    for _ in range(8 * length.max_probe_every):
        ks.append(length.next("s"))
        length.observe("s", ks[-1], ks[-1])
    assert ks[:-1] == [0] * (len(ks) - 1) and ks[-1] == 1


def test_speculator_is_adaptive_by_default_and_k_can_be_fixed():
    assert Speculator(_RepeatDrafter(4)).adaptive
    fixed = Speculator(_RepeatDrafter(4), num_speculative_tokens=3, adaptive=False)
    fixed.start("s", [1])
    fixed.length.observe("s", 3, 0)
    assert fixed.draft_length("s") == 3


def test_greedy_with_self_draft_accepts_everything(main_and_draft):
    main, _ = main_and_draft
    config = GenerationConfig(max_generated_tokens=40, force_max_tokens=True)
    plain, _ = _run(main, PROMPTS[:4], config)
    spec, st = _run(main, PROMPTS[:4], config, draft=main, k=4)
    assert [r.output_ids for r in plain] == [r.output_ids for r in spec]
    assert st.acceptance_rate > 0.99
    assert st.tokens_per_step > 4.5


def test_speculative_respects_stop_strings_and_eos(main_and_draft):
    main, draft = main_and_draft
    plain_out, _ = _run(main, PROMPTS[:4], GenerationConfig(max_generated_tokens=60))
    stop = plain_out[0].text[10:13]
    config = GenerationConfig(max_generated_tokens=60, stop=[stop])
    plain, _ = _run(main, PROMPTS[:4], config)
    spec, _ = _run(main, PROMPTS[:4], config, draft=draft, k=5)
    for a, b in zip(plain, spec, strict=True):
        assert (a.text, a.finished_reason, a.output_ids) == \
            (b.text, b.finished_reason, b.output_ids)
    assert spec[0].finished_reason == "stop" and stop not in spec[0].text


def test_speculative_sampling_matches_model_distribution(main_and_draft):
    """Chi-square over the joint distribution of the first two sampled tokens."""
    main, _ = main_and_draft
    draft = _perturbed(main, 0.3)
    # 3 tokens: the first comes from the prefill; the second is drafted and verified.
    config = dict(deterministic=False, sampling_temperature=1.5, top_k=4, max_generated_tokens=3,
                  force_max_tokens=True)
    prompt = main.tokenizer.encode("def fibonacci(n):")
    # Exact joint distribution P(t1, t2) from the main model alone.
    engine = Engine(main, sequence_length=64)
    dist = make_distribution(GenerationConfig(**config))
    seq = engine.add_sequence()
    p1 = dist(engine.prefill(seq, prompt)[0], prompt)
    exact = {}
    for t1 in np.flatnonzero(p1):
        engine.trim(seq, len(prompt))
        p2 = dist(engine.decode_step([seq], [int(t1)])[0], prompt + [int(t1)])
        for t2 in np.flatnonzero(p2):
            exact[(int(t1), int(t2))] = p1[t1] * p2[t2]
    draws = 1500
    engine = Engine(main, sequence_length=64, max_sequences=16)
    # (a draft as large as the model: adaptive speculation would not draft; always draft 2)
    gen = BatchGenerator(engine, main.tokenizer, [], draft=Engine(draft, sequence_length=64,
                         max_sequences=16), num_speculative_tokens=2,
                         adaptive_speculation=False)
    reqs = [GenerationRequest(prompt, GenerationConfig(seed=i, **config)) for i in range(draws)]
    gen.run(reqs)
    assert gen.speculation.proposed > 0
    assert 0 < gen.speculation.accepted < gen.speculation.proposed  # both paths exercised
    cells = sorted(exact)
    counts = np.zeros(len(cells))
    for r in reqs:
        counts[cells.index(tuple(r.output_ids[:2]))] += 1
    expected = np.array([exact[c] for c in cells]) * draws
    keep = expected >= 5  # chi-square validity; pool the rare cells
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(expected[keep], expected[~keep].sum())
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_pipeline_speculative_and_vocab_check(tiny_model_dir, tmp_path):
    folder = tiny_model_dir("llama")
    base = Pipeline.create(model_path=folder, sequence_length=128, max_generated_tokens=24)
    # (drafts as large as the model: adaptive speculation would not draft; always draft 3)
    spec = Pipeline.create(model_path=folder, sequence_length=128, max_generated_tokens=24,
                           draft_model_path=tiny_model_dir("qwen2"), num_speculative_tokens=3,
                           adaptive_speculation=False)
    assert base(PROMPTS[:3]).sequences == spec(PROMPTS[:3]).sequences
    assert spec.generator.speculation.proposed > 0  # the draft really ran
    itself = Pipeline.create(model_path=folder, sequence_length=128, max_generated_tokens=24,
                             draft_model_path=folder, num_speculative_tokens=3,
                             adaptive_speculation=False)
    assert itself(PROMPTS[:3]).sequences == base(PROMPTS[:3]).sequences
    st = itself.generator.speculation
    assert st.accepted > 0 and st.acceptance_rate > 0.99
    # A draft with another vocabulary is refused with a clear error.
    import json
    import shutil

    other = tmp_path / "other_vocab"
    shutil.copytree(folder, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="vocabulary differs"):
        Pipeline.create(model_path=folder, draft_model_path=other)


def test_self_speculation_needs_no_second_model(tiny_model_dir):
    """draft_model_path="auto": the model drafts for itself in a smaller format (the default
    one, or draft_weights), from the same checkpoint; the output is the model's alone."""
    from sparsellm.generation.drafters import SELF_DRAFT_WEIGHTS

    folder = tiny_model_dir("llama")
    kwargs = dict(model_path=folder, sequence_length=128, max_generated_tokens=24)
    base = Pipeline.create(**kwargs)
    for draft_weights in (None, "int8"):
        spec = Pipeline.create(**kwargs, draft_model_path="auto", draft_weights=draft_weights,
                               num_speculative_tokens=3, adaptive_speculation=False)
        assert spec.draft_engine.checkpoint is spec.engine.checkpoint
        assert set(spec.draft_engine.formats.values()) >= {draft_weights or SELF_DRAFT_WEIGHTS}
        assert base(PROMPTS[:3]).sequences == spec(PROMPTS[:3]).sequences
        st = spec.generator.speculation
        assert st.proposed > 0 and st.accepted > 0  # (a tiny random model: low acceptance)


@pytest.mark.slow
@pytest.mark.parametrize("weights", [None, "int8_a8"])
def test_smollm2_greedy_speculative_identical(smollm2_checkpoint, weights):
    """20 varied prompts x 128 tokens: a self-draft that is perturbed still gives identical text.
    With a W8A8 main model this needs verification logits bitwise equal to one-token steps."""
    draft = _perturbed(smollm2_checkpoint, 0.1)
    config = GenerationConfig(max_generated_tokens=128, force_max_tokens=True)
    plain, _ = _run(smollm2_checkpoint, PROMPTS, config, batch=4, weights=weights)
    spec, st = _run(smollm2_checkpoint, PROMPTS, config, draft=draft, k=4, batch=4,
                    weights=weights)
    assert [r.output_ids for r in plain] == [r.output_ids for r in spec]
    assert st.acceptance_rate > 0.3


def test_speculation_stats_rates():
    assert SpeculationStats().acceptance_rate == 0.0 and SpeculationStats().tokens_per_step == 0.0
    st = SpeculationStats(steps=4, proposed=10, accepted=6)
    assert st.acceptance_rate == 0.6
    assert st.tokens_per_step == 2.5  # (6 accepted + 4 of the main model's own) / 4 steps


def test_accept_draft_rejection_draws_from_the_normalized_residual():
    """Accept d with probability p(d)/q(d); on rejection draw from max(p - q, 0) / its sum."""
    p = np.array([[0.6, 0.4, 0.0], [0.0, 0.0, 1.0]])
    q = np.array([[0.2, 0.8, 0.0]])
    rng = np.random.default_rng(0)
    outcomes = [accept_draft(p, q, [1], rng) for _ in range(4000)]
    assert set(outcomes) == {(1, 2), (0, 0)}  # residual [0.4, 0, 0]: only token 0
    accepted = sum(n for n, _ in outcomes) / len(outcomes)
    assert abs(accepted - 0.5) < 0.03  # p(1) / q(1) = 0.4 / 0.8


def test_accept_draft_never_accepts_a_token_the_draft_could_not_propose():
    p = np.array([[0.2, 0.8, 0.0], [1.0, 0.0, 0.0]])
    rng = np.random.default_rng(0)
    # q(1) = 0: rejected whatever p says; the residual max(p - q, 0) = [0, 0.8, 0] gives 1
    assert {accept_draft(p, np.array([[1.0, 0.0, 0.0]]), [1], rng) for _ in range(50)} == {(0, 1)}
    # p == q: an empty residual falls back to p itself
    same = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    assert accept_draft(same, same[:1], [1], rng) == (0, 0)


def test_incompatible_vocab_message_counts_the_difference():
    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    main = Tok({"a": 0, "b": 1, "c": 2})
    check_compatible_vocab(main, Tok({"a": 0, "b": 1, "c": 2}))
    with pytest.raises(ValueError) as info:
        check_compatible_vocab(main, Tok({"a": 0, "b": 2, "c": 1, "d": 3}))
    assert str(info.value) == (
        "the draft model's vocabulary differs from the main model's (4 vs 3 tokens, 2 main-model "
        "entries missing or renumbered); speculative decoding needs a draft with the same "
        "tokenizer (e.g. a compressed copy of the main model)")


class _FixedRng:
    """random() returns `u`; choice() is recorded (and draws like numpy would, from p)."""

    def __init__(self, u: float):
        self.u, self.choices = u, []

    def random(self) -> float:
        return self.u

    def choice(self, n, p):
        self.choices.append(list(p))
        return int(np.argmax(p))


def test_accept_draft_at_the_edges_of_the_uniform_draw():
    p = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    q = np.array([[0.5, 0.5, 0.0]])
    # a token the main model gives probability 0 is rejected even when the draw is exactly 0
    rng = _FixedRng(0.0)
    assert accept_draft(p, q, [1], rng) == (0, 0)
    # its residual [0.5, 0, 0] holds one token: taken without another random draw
    assert rng.choices == []
    # a draw just below p/q accepts; one at p/q rejects
    p2 = np.array([[0.2, 0.3, 0.5], [0.0, 0.0, 1.0]])
    q2 = np.array([[0.1, 0.6, 0.3]])
    assert accept_draft(p2, q2, [1], _FixedRng(0.4999))[0] == 1
    rng = _FixedRng(0.5)
    assert accept_draft(p2, q2, [1], rng) == (0, 2)  # residual [0.1, 0, 0.2] / 0.3 -> 2
    np.testing.assert_allclose(rng.choices, [[1 / 3, 0.0, 2 / 3]])
