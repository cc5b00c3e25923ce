"""Distribution functions the statistical properties need, without SciPy.

Only the chi-square distribution is needed (the score-variance check of SDPA-2.1);
its CDF is the regularized lower incomplete gamma function P(k/2, x/2).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def regularized_lower_gamma(a: float, x: float) -> float:
    """P(a, x) by its series (x < a + 1) or Lentz's continued fraction (otherwise)."""
    if x <= 0:
        return 0.0
    log_prefactor = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-16:
            n += 1
            term *= x / n
            total += term
        return total * math.exp(log_prefactor)
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    fraction = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        step = d * c
        fraction *= step
        if abs(step - 1) < 1e-16:
            break
    return 1.0 - math.exp(log_prefactor) * fraction


def chi_square_cdf(x: float, dof: int) -> float:
    return regularized_lower_gamma(dof / 2, x / 2)


def chi_square_quantile(probability: float, dof: int) -> float:
    """The x with CDF(x) = probability, by bisection (monotone CDF)."""
    low, high = 0.0, dof + 100 * math.sqrt(2 * dof) + 100
    for _ in range(200):
        middle = (low + high) / 2
        if chi_square_cdf(middle, dof) < probability:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def two_sided_chi_square_interval(dof: int, false_failure: float) -> tuple[float, float]:
    """Acceptance interval with probability ``false_failure`` split over both tails."""
    return (
        chi_square_quantile(false_failure / 2, dof),
        chi_square_quantile(1 - false_failure / 2, dof),
    )


def round_outward(interval: tuple[float, float], decimals: int = 1) -> tuple[float, float]:
    """``interval`` widened to ``decimals`` places: the low end down, the high end up, so
    that the printed interval is the one used and leaves at most the stated tail mass."""
    step = 10.0**decimals
    return math.floor(interval[0] * step) / step, math.ceil(interval[1] * step) / step


def sum_of_squares_range(observed: Any, slack: Any) -> tuple[float, float]:
    """The least and greatest ``sum(d**2) / 2`` over every ``d`` with ``|d - observed| <= slack``
    (elementwise): the values a statistic ``W = sum(D**2) / 2`` can have when each ``D`` is
    known only to within ``slack`` of ``observed``."""
    observed, slack = np.abs(np.asarray(observed, dtype=np.float64)), np.asarray(slack)
    with np.errstate(invalid="ignore"):  # inf - inf where both are infinite: unknown, so 0
        nearest = np.nan_to_num(np.maximum(observed - slack, 0.0), nan=0.0)
    with np.errstate(over="ignore"):  # an infinite slack or log-ratio is an infinite bound
        return float(np.sum(nearest**2) / 2), float(np.sum((observed + slack) ** 2) / 2)
