"""Perplexity: windows, float64 log-softmax, and exact agreement with transformers' logits."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sparsellm.evaluation import (
    PerplexityResult,
    evaluate,
    plan_windows,
    token_nll,
)
from sparsellm.models import load_checkpoint

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n",
    "x",  # one token: nothing to score
    "",  # no tokens
]
LONG_TEXT = "".join(
    f"def f{i}(n):\n    return fib(n - {i}) + {i}\n" for i in range(12)
)  # well over 64 tokens with the tiny tokenizer


@pytest.mark.parametrize("n, window, stride", [(10, 4, 1), (10, 4, 3), (100, 16, 8),
                                               (5, 16, 8), (17, 16, 8), (33, 8, 5)])
def test_windows_score_each_token_once_with_context(n: int, window: int, stride: int) -> None:
    windows = plan_windows(n, window, stride)
    targets = [t for w in windows for t in range(w.first_target, w.end)]
    assert targets == list(range(1, n))
    for i, w in enumerate(windows):
        assert 0 <= w.begin < w.first_target < w.end <= n and w.end - w.begin <= window
        if i:  # later windows: at least window - stride tokens of context, the full window
            assert w.first_target - w.begin >= window - stride and w.end - w.begin == window


def test_window_settings_are_checked() -> None:
    assert plan_windows(1, 8, 4) == [] and plan_windows(0, 8, 4) == []
    for stride in (0, 8, 9):
        with pytest.raises(ValueError, match="stride"):
            plan_windows(20, 8, stride)


def test_token_nll_is_float64_log_softmax() -> None:
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((300, 50)) * 8).astype(np.float32)
    targets = rng.integers(0, 50, 300)
    x = logits.astype(np.float64)
    expected = np.log(np.exp(x).sum(1)) - x[np.arange(300), targets]
    np.testing.assert_allclose(token_nll(logits, targets), expected, rtol=1e-12)


def _transformers_model(folder):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    return torch, model, tok


def _reference_nll(torch, model, ids: list[int], begin: int, end: int, first: int) -> float:
    """NLL of targets ids[first:end] given ids[begin:t], from transformers' logits."""
    with torch.no_grad():
        logits = model(torch.tensor([ids[begin:end]])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    return -sum(logp[t - begin - 1, ids[t]].item() for t in range(first, end))


def test_perplexity_matches_transformers_whole_samples(tiny_model) -> None:
    torch, model, tok = _transformers_model(tiny_model)
    nll, count = 0.0, 0
    for text in TEXTS:
        ids = tok(text).input_ids
        if len(ids) >= 2:
            nll += _reference_nll(torch, model, ids, 0, len(ids), 1)
            count += len(ids) - 1
    result = evaluate(str(tiny_model), datasets=TEXTS, sequence_length=128, batch_size=2)
    assert result.tokens == count and result.samples == len(TEXTS)
    assert result.nll == pytest.approx(nll, rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(nll / count), rel=1e-5)


def test_strided_window_matches_transformers(tiny_model) -> None:
    """A sample longer than sequence_length: HF's fixed-length-model recipe, each token once."""
    torch, model, tok = _transformers_model(tiny_model)
    window, stride = 64, 24
    ids = tok(LONG_TEXT).input_ids
    assert len(ids) > 2 * window
    # Independent reference: windows end at window, window + stride, ... (the last at the end of
    # the sample); each spans `window` tokens and scores the targets the previous one did not.
    nll, prev_end, end = 0.0, 1, window
    while True:
        end = min(end, len(ids))
        nll += _reference_nll(torch, model, ids, max(0, end - window), end, prev_end)
        prev_end = end
        if end == len(ids):
            break
        end += stride
    short = TEXTS[0]
    short_ids = tok(short).input_ids
    nll += _reference_nll(torch, model, short_ids, 0, len(short_ids), 1)
    count = len(ids) - 1 + len(short_ids) - 1
    result = evaluate(str(tiny_model), datasets=[LONG_TEXT, short], sequence_length=window,
                      stride=stride, batch_size=3, prompt_processing_sequence_length=16)
    assert (result.tokens, result.stride, result.sequence_length) == (count, stride, window)
    assert result.nll == pytest.approx(nll, rel=1e-5)
    # Less context than the whole sample gives a different number (the windows really applied).
    whole = evaluate(str(tiny_model), datasets=[LONG_TEXT, short], sequence_length=256)
    assert whole.tokens == count and abs(whole.nll - result.nll) > 1e-3


def test_batching_and_chunking_do_not_change_the_result(tiny_model) -> None:
    checkpoint = load_checkpoint(tiny_model)  # evaluate() also takes a loaded Checkpoint
    texts = TEXTS + [LONG_TEXT]
    results = [
        evaluate(checkpoint, datasets=texts, sequence_length=48, stride=20, batch_size=b,
                 prompt_processing_sequence_length=c)
        for b, c in [(1, 128), (4, 7), (2, 32)]
    ]
    assert len({r.tokens for r in results}) == 1
    for r in results[1:]:
        assert r.nll == pytest.approx(results[0].nll, rel=1e-6)
    assert results[0].model == str(tiny_model)


def test_columns_limit_and_json(tiny_model, tmp_path) -> None:
    path = tmp_path / "data.jsonl"
    records = [{"q": "def add(a, b):\n", "a": "    return a + b\n", "id": i} for i in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = evaluate(str(tiny_model), datasets=str(path), text_column_name=["q", "a"], limit=3,
                      sequence_length=64)
    joined = evaluate(str(tiny_model), datasets=[records[0]["q"] + records[0]["a"]] * 3,
                      sequence_length=64)
    assert isinstance(result, PerplexityResult)
    assert (result.samples, result.limit, result.columns) == (3, 3, ["q", "a"])
    assert result.nll == pytest.approx(joined.nll, rel=1e-9)
    assert result.format == "safetensors:fp32" and result.dataset == str(path)
    data = json.loads(result.to_json())
    assert data == result.to_dict()
    for key in ("perplexity", "tokens", "samples", "seconds", "model", "dataset", "columns",
                "limit", "sequence_length", "stride", "format"):
        assert key in data
    assert "perplexity" in str(result) and "sequence_length=64" in str(result)


def test_bad_input_fails_before_loading_the_model(tmp_path) -> None:
    missing_model = str(tmp_path / "no-model")
    with pytest.raises(ValueError, match="unknown integration 'mmlu'"):
        evaluate(missing_model, datasets=["a b"], integration="mmlu")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        evaluate(missing_model, datasets=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match=r"text column\(s\) \['nope'\]"):
        evaluate(missing_model, datasets=[{"text": "a"}], text_column_name="nope")
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        evaluate(missing_model, datasets=["a"], limit=0)
    with pytest.raises(ValueError, match="lacks"):
        evaluate(missing_model, datasets=[{"text": "a"}], integration="humaneval")


def test_stride_must_leave_context(tiny_model) -> None:
    with pytest.raises(ValueError, match="stride"):
        evaluate(str(tiny_model), datasets=["a b"], sequence_length=32, stride=32)
