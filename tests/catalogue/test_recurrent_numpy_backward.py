"""The NumPy backward catalogue of the gated delta rule (tests/catalogue/
recurrent_numpy_backward.py) through the suite's property runner: the correct explicit
backward passes the gradient property of packed sequences, each bug of the packed backward
fails it on the quick profile, and likewise for a kernel that L2-normalises q and k itself
and the gradient property of one call (issue 37)."""

from __future__ import annotations

from typing import Any

import pytest

from attnspec.backends import Backend
from attnspec.conformance.draw.sizes import SizeLimits
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import FAILED, PASSED
from attnspec.conformance.run.property_runner import run_property
from catalogue import recurrent_numpy_backward as catalogue

# the realistic draws up to 65 tokens and head dims of 64 (chunk edges are at 16, 32, 64):
# the full sizes' loops cost several seconds a property here, and seeds are measured apart
LIMITS = SizeLimits(max_len=65, max_head_dim=64)


def _status(fn: Any, prop: str) -> tuple[str, str]:
    kernel = KernelUnderTest(fn, Backend("numpy"))
    prop_ = all_properties()[prop]
    verdict = run_property(prop_, kernel, profile="quick", limits=LIMITS, shrink=False)
    return verdict.status, verdict.detail or ""


def test_packed_backward_passes() -> None:
    """REC-7.4, REC-3.3, REC-7.7: the hand-written adjoint run per packed sequence, each
    from its own final state's upstream gradient, passes recurrent-gradients-varlen."""
    status, detail = _status(catalogue.varlen_adjoint, "recurrent-gradients-varlen")
    assert status == PASSED, detail


@pytest.mark.parametrize("bug", catalogue.VARLEN_BUGS, ids=lambda bug: bug.name)
def test_each_packed_backward_bug_is_caught(bug: catalogue.GradientBug) -> None:
    """REC-7.4: an adjoint carried across a packed boundary, and past-state gradients
    written to the next sequence's slot, fail recurrent-gradients-varlen on the quick
    profile (their forward pass is right)."""
    status, detail = _status(catalogue.VARLEN_BUGGY[bug.name], "recurrent-gradients-varlen")
    assert status == FAILED, (bug.name, detail)


def test_normalising_backward_passes() -> None:
    """REC-7.5, REC-7.7: a kernel that L2-normalises q and k itself (--recurrent-qk-l2norm)
    and returns the gradients of its inputs through the normalisation passes
    recurrent-gradients-match-reference, keys of norms 1/4 to 4."""
    status, detail = _status(catalogue.l2norm_adjoint, "recurrent-gradients-match-reference")
    assert status == PASSED, detail


@pytest.mark.parametrize("bug", catalogue.NORM_BUGS, ids=lambda bug: bug.name)
def test_each_normalisation_gradient_bug_is_caught(bug: catalogue.GradientBug) -> None:
    """REC-7.5: the normalisation's gradient without its projection, or the normalised
    vectors' gradients returned as the inputs', fail recurrent-gradients-match-reference
    on the quick profile (their forward pass is right)."""
    fn = catalogue.NORM_BUGGY[bug.name]
    status, detail = _status(fn, "recurrent-gradients-match-reference")
    assert status == FAILED, (bug.name, detail)
