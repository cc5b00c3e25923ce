"""Shared fixtures: one parameter per backend, skipped with the reason it is unusable."""

from __future__ import annotations

import pytest
from support import backend_or_skip

from attnspec.backends import BACKEND_NAMES, REFERENCE_CONFIG, Backend


def _load(name: str) -> Backend:
    """The backend in the settings the reference is tested in (JAX: float64 available)."""
    return backend_or_skip(name, config=REFERENCE_CONFIG.get(name))


@pytest.fixture(params=BACKEND_NAMES)
def backend(request: pytest.FixtureRequest) -> Backend:
    """Every backend, each on its default device; CuPy skips where no CUDA device is."""
    return _load(request.param)


@pytest.fixture(params=[n for n in BACKEND_NAMES if n != "cupy"])
def cpu_backend(request: pytest.FixtureRequest) -> Backend:
    """The backends CI must run (all but CuPy, which needs a CUDA device)."""
    return _load(request.param)


@pytest.fixture(scope="session")
def torch_backend() -> Backend:
    """PyTorch on its default device, for the tests about torch's own kernels or dtypes."""
    return backend_or_skip("torch")
