"""The FAVOR+ acceptance test of LIN-6.2, with the numbers of its derivation.

A FAVOR+ kernel is random, so it cannot be compared with a formula element by element.
Instead, its attention weights (observed with ``V = I``) are compared with the exact
softmax weights on inputs where the estimator's variance is known and small, redrawn R
times with independent seeds; the threshold and R are derived in spec/linear.md (LIN-6.2) so
that a correct kernel fails with probability at most ``false_failure``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..reference._checks import check_flag, check_size

CALL = "favor_acceptance_test(estimate_weights, n=..., head_dim=..., num_features=...)"

#: ``estimate_weights(q, k, seed) -> P_hat``: q and k are float64 ``(n, E)``, P_hat ``(n, n)``.
WeightEstimator = Callable[[Any, Any, int], Any]


class FavorThreshold(NamedTuple):
    """The constants of LIN-6.2 for one choice of n, m, r^2 and false-failure probability."""

    sigma: float  # relative standard deviation bound per entry, sqrt((e^{r^2} - 1) / m)
    eta: float  # entry error allowed to a good redraw, 2 sqrt(n) sigma
    threshold: float  # weight-ratio error of a good redraw, 2 eta / (1 - eta)
    redraws: int  # R: odd, with n exp(-R/8) <= false_failure
    false_failure_bound: float  # n exp(-R/8), the proven bound for this R


@dataclass(frozen=True)
class FavorVerdict:
    """The outcome of :func:`favor_acceptance_test`."""

    passed: bool
    statistic: float  # max over rows of the median over redraws of max_j |P_hat/P - 1|
    threshold: float
    redraws: int
    sigma: float
    eta: float
    row_medians: tuple[float, ...]
    redraw_seeds: tuple[int, ...]
    message: str


def _positive(name: str, value: Any, call: str, *, below_one: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}={value!r}, but should be a real number [LIN-6.2, {call}]")
    upper = 1.0 if below_one else math.inf
    if not (0 < value < upper):
        expected = "in (0, 1)" if below_one else "finite and > 0"
        raise ValueError(f"{name}={value!r}, but should be {expected} [LIN-6.2, {call}]")
    return float(value)


def favor_threshold(
    n: int, num_features: int, radius_sq: float = 0.25, false_failure: float = 1e-6
) -> FavorThreshold:
    """sigma, eta, threshold and R of LIN-6.2 for n keys per row and n rows.

    Raises ValueError when ``eta >= 1``: then no threshold is derivable, and more features or
    a smaller ``radius_sq`` are needed (m > 4 n (e^{r^2} - 1)).
    """
    call = "favor_threshold(n, num_features, radius_sq, false_failure)"
    n = check_size("n", n, call, minimum=1)
    num_features = check_size("num_features", num_features, call, minimum=1)
    radius_sq = _positive("radius_sq", radius_sq, call)
    false_failure = _positive("false_failure", false_failure, call, below_one=True)
    sigma = math.sqrt(math.expm1(radius_sq) / num_features)
    eta = 2 * math.sqrt(n) * sigma
    if eta >= 1:
        needed = smallest_num_features(n, radius_sq)
        raise ValueError(
            f"num_features={num_features} gives eta={eta:.3g} >= 1 for n={n} and "
            f"radius_sq={radius_sq}, so no threshold can be derived; should be at least "
            f"{needed}, or use a smaller radius_sq [LIN-6.2, {call}]"
        )
    redraws = math.ceil(8 * math.log(n / false_failure))
    redraws += 1 - redraws % 2  # odd, so the median is one of the redraws
    return FavorThreshold(
        sigma=sigma,
        eta=eta,
        threshold=2 * eta / (1 - eta),
        redraws=redraws,
        false_failure_bound=n * math.exp(-redraws / 8),
    )


def smallest_num_features(n: int, radius_sq: float = 0.25) -> int:
    """The fewest random features for which LIN-6.2's test can be derived (eta < 1):
    m > 4 n (e^{r^2} - 1)."""
    return math.floor(4 * n * math.expm1(radius_sq)) + 1


def favor_usage_error(num_features: int | None, n: int, radius_sq: float = 0.25) -> str | None:
    """Why a FAVOR+ kernel declared with ``num_features`` cannot be checked by LIN-6.2's
    test on ``n`` keys (None when it can): a usage error, not a failed clause."""
    if num_features is None:
        return None
    needed = smallest_num_features(n, radius_sq)
    if num_features >= needed:
        return None
    return (f"num_features={num_features} (--linear-num-features) is too few random features "
            f"for the FAVOR+ statistical test (LIN-6.2): with n={n} keys and r^2={radius_sq} "
            f"it needs m >= {needed} (m > 4 n (e^(r^2) - 1)); declare the kernel with at least "
            f"{needed} features")


def favor_inputs(
    n: int, head_dim: int, *, radius_sq: float = 0.25, offset_norm: float = 3.0, seed: int = 0
) -> tuple[Any, Any]:
    """Queries and keys ``(n, head_dim)`` in float64 with ``|x_i + y_j|^2 <= radius_sq``.

    ``x = c + a_i`` and ``y = -c + b_j`` with ``|c| = offset_norm`` and ``a_i``, ``b_j``
    uniform in the ball of radius ``sqrt(radius_sq) / 2``; returned as ``q = x E^(1/4)``
    and ``k = y E^(1/4)``, so that ``q . k / sqrt(E) = x . y`` (LIN-6.2).
    """
    rng = np.random.default_rng(seed)
    half_radius = math.sqrt(radius_sq) / 2

    def unit(rows: int) -> Any:
        g = rng.standard_normal((rows, head_dim))
        return g / np.linalg.norm(g, axis=-1, keepdims=True)

    offset = offset_norm * unit(1)
    a = unit(n) * half_radius * rng.random((n, 1)) ** (1 / head_dim)
    b = unit(n) * half_radius * rng.random((n, 1)) ** (1 / head_dim)
    root = head_dim**0.25
    return (offset + a) * root, (b - offset) * root


def exact_weights(q: Any, k: Any) -> Any:
    """Softmax weights of ``q k^T / sqrt(E)`` in float64 (NumPy), the target of LIN-6.2."""
    scores = q @ k.T / math.sqrt(q.shape[-1])
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


def favor_acceptance_test(
    estimate_weights: WeightEstimator,
    *,
    n: int,
    head_dim: int,
    num_features: int,
    radius_sq: float = 0.25,
    false_failure: float = 1e-6,
    seed: int = 0,
    offset_norm: float = 3.0,
) -> FavorVerdict:
    """Run LIN-6.2 on ``estimate_weights(q, k, seed) -> P_hat``, the kernel seen through V = I.

    The inputs come from :func:`favor_inputs` with ``seed``; redraw r passes the kernel the
    seed ``seed * R + r``.  A kernel that follows LIN-4.3/LIN-4.4 with ``num_features``
    features fails with probability at most ``false_failure``.
    """
    if not callable(estimate_weights):
        raise TypeError(f"estimate_weights={estimate_weights!r}, but should be callable [{CALL}]")
    head_dim = check_size("head_dim", head_dim, CALL, minimum=1)
    seed = check_size("seed", seed, CALL)
    if isinstance(offset_norm, bool) or not isinstance(offset_norm, (int, float)) or not (
        math.isfinite(offset_norm) and offset_norm >= 0
    ):
        raise ValueError(f"offset_norm={offset_norm!r}, but should be finite and >= 0 [{CALL}]")
    bound = favor_threshold(n, num_features, radius_sq, false_failure)
    q, k = favor_inputs(n, head_dim, radius_sq=radius_sq, offset_norm=offset_norm, seed=seed)
    weights = exact_weights(q, k)
    seeds = tuple(range(seed * bound.redraws, (seed + 1) * bound.redraws))
    errors = np.empty((bound.redraws, n))
    for r, redraw_seed in enumerate(seeds):
        estimate = np.asarray(estimate_weights(q.copy(), k.copy(), redraw_seed), dtype=np.float64)
        if estimate.shape != (n, n):
            raise ValueError(
                f"estimate_weights returned shape {estimate.shape}, but should return the "
                f"({n}, {n}) weights [{CALL}]"
            )
        ratio_error = np.abs(estimate / weights - 1)
        # A non-finite weight is as wrong as a weight can be.
        errors[r] = np.where(np.isfinite(ratio_error), ratio_error, np.inf).max(axis=-1)
    row_medians = np.median(errors, axis=0)
    worst = int(np.argmax(row_medians))
    statistic = float(row_medians[worst])
    passed = statistic <= bound.threshold
    setting = (
        f"n={n}, E={head_dim}, m={num_features}, r^2={radius_sq}, R={bound.redraws}, "
        f"sigma={bound.sigma:.4g}, eta={bound.eta:.4g}, seed={seed}"
    )
    if passed:
        message = (
            f"LIN-6.2 passed: the largest per-row median of max_j |P_hat/P - 1| is "
            f"{statistic:.4g} <= {bound.threshold:.4g} ({setting})"
        )
    else:
        message = (
            f"LIN-6.2 failed: row {worst} has median max_j |P_hat/P - 1| = {statistic:.4g} > "
            f"{bound.threshold:.4g} ({setting}); a correct FAVOR+ estimator with {num_features} "
            f"features fails with probability <= {bound.false_failure_bound:.3g}, so the "
            "kernel's weights are biased or noisier than its features allow"
        )
    return FavorVerdict(
        passed=passed,
        statistic=statistic,
        threshold=bound.threshold,
        redraws=bound.redraws,
        sigma=bound.sigma,
        eta=bound.eta,
        row_medians=tuple(float(x) for x in row_medians),
        redraw_seeds=seeds,
        message=message,
    )


def reference_estimator(num_features: int, *, orthogonal: bool = True) -> WeightEstimator:
    """``estimate_weights`` for the reference FAVOR+ attention (NumPy), observed with V = I."""
    check_flag("orthogonal", orthogonal, "reference_estimator(num_features)")
    from ..reference.favor import favor_attention

    def estimate(q: Any, k: Any, seed: int) -> Any:
        identity = np.eye(k.shape[0])
        out = favor_attention(
            q[None], k[None], identity[None], num_features=num_features, seed=seed,
            orthogonal=orthogonal,
        )
        return np.asarray(out)[0]

    return estimate
