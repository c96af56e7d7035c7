import numpy as np
import pytest

from sparsellm import kernels

ISAS = ["scalar", "avx2", "avx512"]


@pytest.fixture(params=ISAS)
def isa(request):
    """Run a test on the portable scalar path, the AVX2 path and the AVX-512 path (W8A8 and
    sparse int4 kernels; skipped on CPUs without it)."""
    from sparsellm.kernels._ext import native

    if request.param == "avx2" and not native().cpu_supports_avx2():
        pytest.skip("CPU without AVX2/FMA")
    if request.param == "avx512" and not native().cpu_supports_avx512():
        pytest.skip("CPU without AVX512 F/BW/VL/VNNI/VBMI2")
    kernels.set_isa(request.param)
    yield request.param
    kernels.set_isa("auto")


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def threads():
    """threads(n) sets the native thread count for the test; the previous count comes back."""
    saved = kernels.get_num_threads()
    yield kernels.set_num_threads
    kernels.set_num_threads(saved)
