import numpy as np
import pytest

from sparsellm import kernels

ISAS = ["scalar", "avx2"]


@pytest.fixture(params=ISAS)
def isa(request):
    """Run a test once on the portable scalar path and once on the AVX2 path."""
    from sparsellm.kernels._ext import native

    if request.param == "avx2" and not native().cpu_supports_avx2():
        pytest.skip("CPU without AVX2/FMA")
    kernels.set_isa(request.param)
    yield request.param
    kernels.set_isa("auto")


@pytest.fixture
def rng():
    return np.random.default_rng(0)
