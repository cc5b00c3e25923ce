"""The NumPy backward catalogue of the gated delta rule (tests/catalogue/
recurrent_numpy_backward.py) through the suite's property runner: the correct explicit
backward passes the gradient property of packed sequences, each bug of the packed backward
fails it on the quick profile, and likewise for a kernel that L2-normalises q and k itself
and the gradient property of one call (issue 37)."""

from __future__ import annotations

from typing import Any

import pytest
import support

from attnspec.backends import Backend
from attnspec.conformance.draw.sizes import SizeLimits
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import FAILED, PASSED
from attnspec.conformance.run.property_runner import run_property
from catalogue import recurrent_numpy_backward as catalogue

# the kernels run token by token (no chunk edges to meet): the realistic draws capped at 17
# tokens and head dims of 16, since the full sizes' loops cost seconds a property here (the
# full sizes over seeds 0-19 are in spec/recurrent.md, section 9)
LIMITS = SizeLimits(max_len=17, max_head_dim=16)


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


def test_a_backend_that_compiles_per_shape_meets_few_shapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cost, not a clause (REC-7.4's property): on a backend that compiles per shape
    (JAX's jit: a compilation per signature), the recurrence's sizes and its split points
    come from a few per stratum (draw.shape_pool), so recurrent-gradients-state-passing
    calls the kernel with at most half the signatures it meets elsewhere (sizes capped:
    the count, not the sizes, is checked)."""
    from attnspec.conformance.judge.properties import recurrent

    seen: set[tuple[Any, ...]] = set()
    gradients = recurrent._gradients

    def recording(kernel: Any, call: Any, tokens: Any, *rest: Any, **extra: Any) -> Any:
        seen.add((call.dtype, tokens["q"].shape, tokens["v"].shape))
        return gradients(kernel, call, tokens, *rest, **extra)

    monkeypatch.setattr(recurrent, "_gradients", recording)
    prop = all_properties()["recurrent-gradients-state-passing"]
    counts = []
    for backend in (Backend("numpy"), support.compiling("numpy")):
        seen.clear()
        kernel = KernelUnderTest(catalogue.varlen_adjoint, backend)
        small = SizeLimits(max_len=9, max_head_dim=8)
        verdict = run_property(prop, kernel, profile="quick", limits=small, shrink=False)
        assert verdict.status == PASSED, verdict.detail
        counts.append(len(seen))
    assert 2 * counts[1] <= counts[0], counts  # 10 against 37 at seed 0
