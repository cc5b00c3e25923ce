"""Fixtures shared by the tests of the conformance suite's front ends."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from support import run_python

from attnspec.conformance import Problem, PropertyFailure
from attnspec.conformance.judge.registration import REGISTRY, always, register
from attnspec.conformance.judge.registry import all_properties


@pytest.fixture
def should_property() -> Iterator[str]:
    """A test double registered for one test: a SHOULD-level property that always fails.

    It exercises how a failed SHOULD clause is reported (CONF-2) independently of which
    real SHOULD properties exist; its clause is a real SHOULD clause, so the level is
    read from the spec as for any property.
    """
    property_id = "test-double-should"
    all_properties()

    @register(property_id, "SDPA-8.2", kind="fixed", applies=always)
    def always_warns(kernel, seed):  # type: ignore[no-untyped-def]
        """Test double: fails every kernel, on one tiny problem, at SHOULD level."""
        one = np.ones((1, 1, 1))
        raise PropertyFailure("test double failed", Problem(one, one, one, "float64"), kernel)

    try:
        yield property_id
    finally:
        del REGISTRY[property_id]


@pytest.fixture
def python_c() -> Callable[..., subprocess.CompletedProcess[str]]:
    """:func:`support.run_python`: a snippet (a reproduction, a probe of a library) in its
    own process."""
    return run_python
