"""CONF-4: the chi-square machinery behind score-variance (SDPA-2.1) is right, and the
property's false-failure probability stays <= 1e-6 with the rounding of every dtype."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import verdict_of

import attnspec
from attnspec.backends import Backend
from attnspec.conformance import KernelUnderTest, declare
from attnspec.conformance.judge.properties.scale import (
    SCORE_VARIANCE_PAIRS,
    score_variance_interval,
)
from attnspec.conformance.judge.statistics import (
    chi_square_cdf,
    chi_square_quantile,
    sum_of_squares_range,
    two_sided_chi_square_interval,
)
from attnspec.conformance.judge.verdict import FAILED, PASSED
from attnspec.reference.tolerance import UNIT_ROUNDOFF, error_bound

SPEC = Path(attnspec.__file__).parent / "spec"


@pytest.mark.parametrize(
    ("x", "dof", "expected"),
    [
        (3.841458820694124, 1, 0.95),  # textbook critical values
        (5.991464547107979, 2, 0.95),
        (2.0, 2, 1 - math.exp(-1.0)),  # chi^2_2 is exponential with mean 2
        (10.0, 2, 1 - math.exp(-5.0)),
    ],
)
def test_cdf_matches_closed_forms(x: float, dof: int, expected: float) -> None:
    """The regularized incomplete gamma gives known chi-square probabilities."""
    assert chi_square_cdf(x, dof) == pytest.approx(expected, rel=1e-9)


def test_quantile_inverts_the_cdf() -> None:
    for dof in (1, 7, 2000):
        for p in (1e-7, 0.5, 1 - 1e-7):
            assert chi_square_cdf(chi_square_quantile(p, dof), dof) == pytest.approx(p, rel=1e-6)


def test_score_variance_interval_has_the_stated_false_failure_rate() -> None:
    """SDPA-2.1 / CONF-4: the interval for N = 2000 leaves 1e-6 in total, and a simulation
    of W = chi^2_2000 (10^5 draws, fixed seed) lands outside it never (expected 0.1 times)."""
    low, high = two_sided_chi_square_interval(2000, 1e-6)
    assert (1 - chi_square_cdf(high, 2000)) + chi_square_cdf(low, 2000) == pytest.approx(1e-6)
    draws = np.random.default_rng(0).chisquare(2000, size=100_000)
    assert np.all((draws >= low) & (draws <= high))


# --- score-variance (SDPA-2.1, CONF-4): the interval as printed, and rounding in every dtype ---

DTYPES = ("float16", "bfloat16", "float32", "float64")


def test_printed_interval_is_rounded_outward_and_leaves_at_most_1e_6() -> None:
    """CONF-4: the interval the property uses and prints, [1705.7, 2324.9], contains the exact
    5e-7 quantiles of chi^2_2000, and its tail mass computed by SciPy (an implementation
    independent of ours) is at most 1e-6; the inward-rounded [1705.8, 2324.8] printed before
    left 1.0018e-6.  The spec states the same numbers."""
    # chdtr and chdtrc: chi^2's CDF and survival function, the Cephes routines behind
    # scipy.stats.chi2's cdf and sf (the same numbers), without importing scipy.stats
    # (~0.5-1.2 CPU-s, for this test alone)
    special = pytest.importorskip("scipy.special", reason="SciPy is the independent CDF")
    low, high = score_variance_interval()
    exact_low, exact_high = two_sided_chi_square_interval(SCORE_VARIANCE_PAIRS, 1e-6)
    assert (low, high) == (1705.7, 2324.9)
    assert low <= exact_low and exact_high <= high

    def tail_mass(low: float, high: float) -> float:
        return float(special.chdtr(SCORE_VARIANCE_PAIRS, low)) + float(
            special.chdtrc(SCORE_VARIANCE_PAIRS, high)
        )

    assert tail_mass(low, high) <= 1e-6
    assert tail_mass(1705.8, 2324.8) > 1e-6
    assert "$[1705.7, 2324.9]$" in (SPEC / "dense.md").read_text()


def test_sum_of_squares_range_is_the_extremes() -> None:
    """SDPA-2.1: the least and greatest W for log-ratios known within a slack."""
    assert sum_of_squares_range([1.0, -3.0], [0.5, 4.0]) == (0.125, 25.625)
    assert sum_of_squares_range([1.0], [np.inf]) == (0.0, np.inf)


def tol2_adversary(direction: int, dtype: str, backend: Backend) -> Any:
    """A kernel within TOL-2 that spends all of its bound but the room its own output
    rounding needs (2 u_d |w|) pushing each pair's weight log-ratio outward (+1: W grows) or
    inward (-1: W shrinks): the worst a correct kernel may do.  It records the plain W of
    its output."""

    def kernel(q: Any, k: Any, v: Any, *, mask=None, is_causal=False, scale=None) -> Any:
        q64, k64, v64 = (backend.to_numpy(a).astype(np.float64) for a in (q, k, v))
        bound = error_bound(q64, k64, v64, dtype=dtype)
        weights, tolerance = np.asarray(bound.out), np.asarray(bound.out_tolerance)
        larger = weights[..., 1:] > weights[..., :1]
        push = np.concatenate([np.where(larger, -1.0, 1.0), np.where(larger, 1.0, -1.0)], -1)
        room = np.maximum(tolerance - 2 * UNIT_ROUNDOFF[dtype] * weights, 0)
        out = backend.asarray(np.maximum(weights + direction * push * room, 0), dtype)
        seen = backend.to_numpy(out).astype(np.float64)
        assert np.all(np.abs(seen - weights) <= tolerance)  # the premise: within TOL-2
        kernel.plain_statistic = float(np.sum(np.log(seen[..., 0, 1] / seen[..., 0, 0]) ** 2) / 2)
        return out

    return declare(kernel, dtypes=(dtype,))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("direction", [1, -1], ids=["outward", "inward"])
def test_kernels_at_the_edge_of_tol2_pass_in_every_dtype(
    dtype: str, direction: int, torch_backend: Backend
) -> None:
    """SDPA-2.1, CONF-4: a kernel within TOL-2 that moves every log-ratio as far as its bound
    allows passes score-variance in every dtype (seeds 0-2), so rounding adds nothing to the
    1e-6."""
    for seed in range(3):
        kernel = tol2_adversary(direction, dtype, torch_backend)
        result = verdict_of("score-variance", KernelUnderTest(kernel, torch_backend), seed=seed)
        assert result.status == PASSED, result.detail


WRONG_SCALES = {
    "divides by E (or the scale applied twice)": lambda e: 1 / e,
    "no scale at all": lambda e: 1.0,
    "divides by sqrt(Ev)": lambda e: 1 / math.sqrt(2),  # V = I_2, so Ev = 2
}


# Erratum E-2026.12-14 (2026-12-06) made TOL-2's scale term one rounding in the input dtype at
# every scale; score-variance's slack, derived from TOL-2, grew with it in bfloat16, where a
# kernel dividing the scores by E instead of sqrt(E) now passes score-variance at the head
# dims it draws.  A loss of detection to be won back (a slack that does not charge the scale
# rounding to the variance statistic), kept visible here: strict, so it fails once fixed.
LOST_BY_ERRATUM_14 = pytest.mark.xfail(
    strict=True,
    reason="E-2026.12-14 widened TOL-2's scale term; score-variance's bfloat16 slack now "
    "admits 1/E (to be won back)",
)


def _wrong_scale_cases() -> list[Any]:
    cases = []
    for bug in sorted(WRONG_SCALES):
        for dtype in DTYPES:
            marks = (
                [LOST_BY_ERRATUM_14]
                if (bug.startswith("divides by E") and dtype == "bfloat16")
                else []
            )
            cases.append(pytest.param(dtype, bug, marks=marks, id=f"{bug}-{dtype}"))
    return cases


@pytest.mark.parametrize(("dtype", "bug"), _wrong_scale_cases())
def test_wrong_scales_still_fail_in_every_dtype(
    dtype: str, bug: str, torch_backend: Backend
) -> None:
    """SDPA-2.1: with the rounding slack, the wrong default scales the old test caught still
    fail in every dtype, bfloat16 included (there 1/E reaches at most W ~ 162 < 1705.7)."""

    def kernel(q: Any, k: Any, v: Any, *, mask=None, is_causal=False, scale=None) -> Any:
        return attnspec.scaled_dot_product_attention(q, k, v, scale=WRONG_SCALES[bug](q.shape[-1]))

    result = verdict_of("score-variance", declare(kernel, dtypes=(dtype,)), backend=torch_backend)
    assert result.status == FAILED, result.detail
