"""Distribution functions the statistical properties need, without SciPy.

Only the chi-square distribution is needed (the score-variance check of SDPA-2.1);
its CDF is the regularized lower incomplete gamma function P(k/2, x/2).
"""

from __future__ import annotations

import math


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
