"""kernels.memory.gather: a model's packed weights moved into one huge-page block."""

import numpy as np

from sparsellm.kernels import linear, pack
from sparsellm.kernels.memory import gather


def test_gather_keeps_contents_and_results_and_packs_buffers_in_order():
    rng = np.random.default_rng(0)
    shapes = [(37, 70), (64, 576), (5, 130)]
    fmts = ["sparse_int4_g32_a8", "int8_a8", "fp32"]
    ws = [pack(rng.standard_normal(s).astype(np.float32), f,
               rng.random(s) < 0.5 if f.startswith("sparse") else None)
          for s, f in zip(shapes, fmts, strict=True)]
    xs = [rng.standard_normal((3, s[1])).astype(np.float32) for s in shapes]
    before = [linear(x, w) for x, w in zip(xs, ws, strict=True)]  # builds the native descriptors
    copies = [{k: a.copy() for k, a in w.arrays.items()} for w in ws]

    gather(ws)

    starts = []
    for w, old in zip(ws, copies, strict=True):
        assert w.arrays.keys() == old.keys()
        for key, a in w.arrays.items():
            np.testing.assert_array_equal(a, old[key])
            assert a.dtype == old[key].dtype and a.flags.c_contiguous
            assert a.ctypes.data % 64 == 0
            starts.append(a.ctypes.data)
    assert starts == sorted(starts)  # the order the weights (and their buffers) were given
    assert starts[-1] - starts[0] < sum(a.nbytes + 64 for c in copies for a in c.values())
    assert starts[0] % (2 << 20) == 0  # the block starts on a huge page
    # the native descriptors were rebuilt over the new buffers
    for x, w, y in zip(xs, ws, before, strict=True):
        np.testing.assert_array_equal(linear(x, w), y)


def test_gather_of_nothing_is_a_no_op(monkeypatch):
    """No weights (or only empty ones): no mapping is made and no buffer moves."""
    import sparsellm.kernels.memory as memory

    rng = np.random.default_rng(1)
    w = pack(rng.standard_normal((8, 64)).astype(np.float32), "int8_a8")
    x = rng.standard_normal((2, 64)).astype(np.float32)
    before = linear(x, w)
    addresses = {k: a.ctypes.data for k, a in w.arrays.items()}
    contents = {k: a.copy() for k, a in w.arrays.items()}

    def no_mapping(*args, **kwargs):
        raise AssertionError("gather of nothing mapped memory")

    monkeypatch.setattr(memory.mmap, "mmap", no_mapping)
    assert gather([]) is None
    assert gather(iter([])) is None
    # a weight that was not passed keeps its buffers where they were, unchanged
    assert {k: a.ctypes.data for k, a in w.arrays.items()} == addresses
    for k, a in w.arrays.items():
        np.testing.assert_array_equal(a, contents[k])
    np.testing.assert_array_equal(linear(x, w), before)
    monkeypatch.undo()
    gather([w])  # and the same weight, passed, does move
    assert {k: a.ctypes.data for k, a in w.arrays.items()} != addresses
