"""Fidelity checks run small simulations: keep BLAS single-threaded (the machine is shared and
oversubscribed BLAS threads make the small dot products several times slower)."""

from contextlib import nullcontext

import pytest

try:  # a dependency of scikit-learn; optional here
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover
    threadpool_limits = None


@pytest.fixture(autouse=True)
def _one_blas_thread():
    with threadpool_limits(limits=1) if threadpool_limits else nullcontext():
        yield
