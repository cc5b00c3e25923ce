"""The property tests' kernels return with their work done: none writes its inputs after
the call (the late writer is a forger of tests/catalogue/forgers.py, caught in
tests/conformance/test_forgery.py), so inputs-unmodified re-reads them at once here."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _inputs_rechecked_at_once(inputs_rechecked_at_once: None) -> None:
    """tests/conftest.py's ``inputs_rechecked_at_once``, for every test here."""
