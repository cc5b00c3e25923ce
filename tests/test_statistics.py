"""CONF-4: the chi-square machinery behind score-variance (SDPA-2.1) is right."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnspec.conformance.statistics import (
    chi_square_cdf,
    chi_square_quantile,
    two_sided_chi_square_interval,
)


@pytest.mark.parametrize(("x", "dof", "expected"), [
    (3.841458820694124, 1, 0.95),      # textbook critical values
    (5.991464547107979, 2, 0.95),
    (2.0, 2, 1 - math.exp(-1.0)),      # chi^2_2 is exponential with mean 2
    (10.0, 2, 1 - math.exp(-5.0)),
])
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
