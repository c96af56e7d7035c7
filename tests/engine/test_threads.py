"""Threads per engine (issue 27 item 5): each engine's native calls run on its own thread count.

The pool reports how many threads ran each parallel region (`_native.region_threads`,
`NativeModel.last_threads`: the workers that actually took part), so the tests check the count
a call used, not only the setting.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from sparsellm import kernels
from sparsellm.engine import Engine
from sparsellm.kernels._ext import native
from sparsellm.models import load_checkpoint
from sparsellm.server.config import ServerConfig
from sparsellm.server.metrics import Metrics
from sparsellm.server.provider import ModelProvider

PROMPT = 40  # tokens: enough that the tiny model's projections and attention run in parallel


@pytest.fixture
def default_one_thread():
    """The process default at 1 thread, so a count of 2 can only come from the engine."""
    saved = kernels.get_num_threads()
    kernels.set_num_threads(1)
    yield
    kernels.set_num_threads(saved)


@pytest.fixture(scope="module")
def checkpoint(tiny_llama_dir):
    return load_checkpoint(tiny_llama_dir)


def run(engine: Engine, ids: list[int], steps: int = 4) -> tuple[list[np.ndarray], list[int]]:
    """Prefill `ids`, then greedy decode steps -> (logits of each call, threads of each call)."""
    seq = engine.add_sequence()
    logits = [engine.prefill(seq, ids, all_logits=True)]
    threads = [engine.model.last_threads]
    for _ in range(steps):
        logits.append(engine.decode_step([seq], [int(np.argmax(logits[-1][-1]))]))
        threads.append(engine.model.last_threads)
    engine.release(seq)
    return logits, threads


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_region_runs_on_the_per_call_count(default_one_thread, n):
    reported, ran = native().region_threads(n)
    assert (reported, ran) == (n, n)
    assert native().region_threads(0) == (1, 1)  # no count: the process default
    assert kernels.get_num_threads() == 1  # a per-call count leaves the default alone


def test_two_engines_with_different_counts_in_one_process(default_one_thread, checkpoint,
                                                           token_ids):
    ids = token_ids(PROMPT, seed=11)
    one = Engine(checkpoint, sequence_length=64, num_cores=1)
    two = Engine(checkpoint, sequence_length=64, num_cores=2)
    default = Engine(checkpoint, sequence_length=64)
    assert (one.num_threads, two.num_threads, default.num_threads) == (1, 2, 1)

    want, used_one = run(one, ids)
    got, used_two = run(two, ids)
    _, used_default = run(default, ids)
    assert used_one == [1] * len(used_one)
    assert used_two[0] == 2  # the prefill's regions ran on both of the engine's threads
    assert max(used_two) == 2 and max(used_default) == 1
    for g, w in zip(got, want, strict=True):  # the thread split does not change the numbers
        np.testing.assert_array_equal(g, w)

    kernels.set_num_threads(2)  # a new process default changes the engine without a count only
    assert (one.num_threads, two.num_threads, default.num_threads) == (1, 2, 2)
    assert run(one, ids)[1][0] == 1 and run(default, ids)[1][0] == 2


@pytest.mark.parametrize("counts", [(1, 2), (2, 3)])  # (2, 3): the pool grows mid-run
def test_two_engines_used_at_once_from_two_threads(default_one_thread, checkpoint, token_ids,
                                                   counts):
    engines = [Engine(checkpoint, sequence_length=64, num_cores=n) for n in counts]
    prompts = [token_ids(PROMPT, seed=20 + i) for i in range(len(engines))]
    single = Engine(checkpoint, sequence_length=64, num_cores=1)
    want = [run(single, p)[0] for p in prompts]
    results: list[list] = [[] for _ in engines]
    errors: list[BaseException] = []
    start = threading.Barrier(len(engines))

    def work(i: int) -> None:
        try:
            start.wait()
            for _ in range(5):
                results[i].append(run(engines[i], prompts[i]))
        except BaseException as e:  # reported below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(engines))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlock: a thread did not finish"
    assert not errors, errors
    for i, n in enumerate(counts):
        assert len(results[i]) == 5
        for logits, used in results[i]:
            # At most the engine's own count (fewer while the other thread holds the pool),
            # and the same numbers as on one thread.
            assert min(used) >= 1 and max(used) <= n
            for g, w in zip(logits, want[i], strict=True):
                np.testing.assert_array_equal(g, w)


def test_num_cores_is_refused_where_it_cannot_be_honoured(checkpoint):
    with pytest.raises(ValueError, match="num_cores needs the native backend"):
        Engine(checkpoint, sequence_length=16, backend="numpy", num_cores=2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_cores must be a positive integer"):
            Engine(checkpoint, sequence_length=16, num_cores=bad)
    assert Engine(checkpoint, sequence_length=16, backend="numpy").num_threads >= 1


def test_server_endpoints_each_run_on_their_own_count(default_one_thread, tiny_llama_dir):
    config = ServerConfig(num_cores=1, endpoints=[
        {"model": str(tiny_llama_dir), "name": "one", "kwargs": {"sequence_length": 64}},
        {"model": str(tiny_llama_dir), "name": "two",
         "kwargs": {"sequence_length": 64, "num_cores": 2}},
    ])
    served = {m.name: m for m in ModelProvider(config).load(Metrics())}
    engines = {name: m.pipeline.engine for name, m in served.items()}
    assert {name: e.num_threads for name, e in engines.items()} == {"one": 1, "two": 2}
    ids = list(range(10, 10 + PROMPT))
    for name, n in (("one", 1), ("two", 2)):
        served[name].pipeline(prompt="hello world", max_generated_tokens=2)
        assert run(engines[name], ids)[1][0] == n
