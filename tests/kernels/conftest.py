import numpy as np
import pytest

from sparsellm import kernels


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def threads():
    """threads(n) sets the native thread count for the test; the previous count comes back."""
    saved = kernels.get_num_threads()
    yield kernels.set_num_threads
    kernels.set_num_threads(saved)
