"""The native thread pool (csrc/include/threads.h): results do not depend on the thread count,
concurrent callers and forked children work, and oversubscription (more threads than cores) is
correct."""

import os
import threading

import numpy as np
import pytest

from sparsellm import kernels

from .test_linear import random_weight

FORMATS = ["fp32", "int8_a8", "int4_g32_asym", "sparse_int8_a8", "2:4_int8"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_linear_is_bitwise_the_same_for_any_thread_count(rng, threads, fmt):
    # Rows are split between threads, never the sum over one row, so every count gives the same
    # bits; 3 and 5 threads on fewer cores exercise oversubscription and uneven splits.
    w, mask = random_weight(rng, (515, 256), fmt)
    p = kernels.pack(w, fmt, mask)
    x = rng.standard_normal((20, 256)).astype(np.float32)
    threads(1)
    want = {T: kernels.linear(x[:T], p) for T in (1, 5, 20)}
    for n in (2, 3, 5):
        threads(n)
        for T, y in want.items():
            np.testing.assert_array_equal(kernels.linear(x[:T], p), y, err_msg=f"{n} threads")


def test_attention_prefill_is_the_same_for_any_thread_count(rng, threads):
    # Big enough for the parallel path (tasks handed out from a shared counter).
    T, H, KV, hd = 96, 8, 2, 64
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    k = rng.standard_normal((1, KV, T, hd)).astype(np.float32)
    v = rng.standard_normal((1, KV, T, hd)).astype(np.float32)
    pos = np.arange(T, dtype=np.int64)
    slots = np.zeros(T, np.int64)
    threads(1)
    want = kernels.attention(q, k, v, slots, pos, 0.125)
    for n in (2, 3):
        threads(n)
        np.testing.assert_array_equal(kernels.attention(q, k, v, slots, pos, 0.125), want)


def test_concurrent_callers_get_their_own_results(rng, threads):
    # Native calls release the GIL; a caller that finds the pool busy runs on its own thread.
    threads(2)
    p = kernels.pack(rng.standard_normal((600, 256)).astype(np.float32), "int8_a8")
    xs = [rng.standard_normal((4, 256)).astype(np.float32) for _ in range(4)]
    want = [kernels.linear(x, p) for x in xs]
    errors = []

    def worker(i):
        for _ in range(50):
            if not np.array_equal(kernels.linear(xs[i], p), want[i]):
                errors.append(i)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_runs_kernels(rng, threads):
    # The parent's worker threads do not exist in a forked child; the child gets a new pool.
    threads(2)
    p = kernels.pack(rng.standard_normal((600, 256)).astype(np.float32), "fp32")
    x = rng.standard_normal((3, 256)).astype(np.float32)
    want = kernels.linear(x, p)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        ok = np.array_equal(kernels.linear(x, p), want)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
