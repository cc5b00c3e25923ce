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

from ...reference._checks import check_flag, check_size
from ...reference.tolerance import (
    SAFETY_FACTOR,
    UNDERFLOW_THRESHOLD,
    UNIT_ROUNDOFF,
    accumulation_roundoff,
)

CALL = "favor_acceptance_test(estimate_weights, n=..., head_dim=..., num_features=...)"
#: The tail event of the rounding allowance: some |w_l . x| > t |x| or |w_l| > sqrt(E) + t.
TAIL_SIGMAS = 9.0
#: Dtypes whose rounding LIN-6.2 can allow for: float16 stores features below 2^-14 as
#: subnormals or zeros, which no relative allowance covers.
ROUNDING_DTYPES = ("bfloat16", "float32", "float64")
#: The n queries (and keys) and head dim E of the problems LIN-6.2's test draws: a FAVOR+
#: kernel is set up only if its declared feature count is enough for n (favor_usage_error).
FAVOR_TEST_QUERIES, FAVOR_TEST_HEAD_DIM = 16, 8

#: ``estimate_weights(q, k, seed) -> P_hat``: q and k are float64 ``(n, E)``, P_hat ``(n, n)``.
WeightEstimator = Callable[[Any, Any, int], Any]


class FavorThreshold(NamedTuple):
    """The constants of LIN-6.2 for one choice of n, m, r^2 and false-failure probability."""

    sigma: float  # relative standard deviation bound per entry, sqrt((e^{r^2} - 1) / m)
    eta: float  # entry error allowed to a good redraw, 2 sqrt(n) sigma
    threshold: float  # weight-ratio error of a good redraw, 2 eta / (1 - eta)
    redraws: int  # R: odd, with n exp(-2 R (1/4 - tail)^2) <= false_failure
    false_failure_bound: float  # n exp(-2 R (1/4 - tail)^2), the proven bound for this R
    tail: float  # probability of the tail event that voids the rounding allowance


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
    tail = tail_probability(n, num_features)
    per_redraw = 2 * (0.25 - tail) ** 2  # Hoeffding's exponent with P(bad redraw) <= 1/4 + tail
    redraws = math.ceil(math.log(n / false_failure) / per_redraw)
    redraws += 1 - redraws % 2  # odd, so the median is one of the redraws
    return FavorThreshold(
        sigma=sigma,
        eta=eta,
        threshold=2 * eta / (1 - eta),
        redraws=redraws,
        false_failure_bound=n * math.exp(-per_redraw * redraws),
        tail=tail,
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
    return (
        f"num_features={num_features} (--linear-num-features) is too few random features "
        f"for the FAVOR+ statistical test (LIN-6.2): with n={n} keys and r^2={radius_sq} "
        f"it needs m >= {needed} (m > 4 n (e^(r^2) - 1)); declare the kernel with at least "
        f"{needed} features"
    )


def tail_probability(n: int, num_features: int) -> float:
    """P(some |w_l . x| > t |x| over the 2n rows, or some |w_l| > sqrt(E) + t), t = 9.

    Each row w_l is marginally N(0, I_E) (LIN-4.4), so w_l . x / |x| is N(0, 1) and, the norm
    being 1-Lipschitz with mean at most sqrt(E), P(|w_l| > sqrt(E) + t) <= e^{-t^2/2}.
    """
    t = TAIL_SIGMAS
    return num_features * (2 * n * math.erfc(t / math.sqrt(2)) + math.exp(-t * t / 2))


def rounding_allowance(q: Any, k: Any, num_features: int, dtype: str, eta: float) -> float:
    """kappa: outside the tail event, on a good redraw, a kernel computing in ``dtype`` has
    weights within a factor 1 +- kappa of its own exact-arithmetic weights (LIN-6.2).

    LIN-5.2 with V = I gives C (2 rho + 2 u_a + u_d) relative plus its floor; its feature error
    a uses the largest exponent the tail event allows; and products that underflow (flushed
    to zero) lose at most 4 m lambda_a per kernel value, against the smallest value
    (1 - eta) e^{x.y} min(1, e^{-c_i - c}) that a good redraw has with the stabilisers of
    LIN-4.6 (a row's maximum exponent c_i <= t|x| - |x|^2/2 for queries, the head's for keys).
    """
    if dtype not in ROUNDING_DTYPES:
        raise ValueError(
            f"dtype={dtype!r}, but should be one of {ROUNDING_DTYPES}: FAVOR+ features in "
            f"float16 fall below its smallest normal number 2^-14 [LIN-6.2, {CALL}]"
        )
    n, head_dim = q.shape
    u_d, u_a, m, t = UNIT_ROUNDOFF[dtype], accumulation_roundoff(dtype), num_features, TAIL_SIGMAS
    x, y = q / head_dim**0.25, k / head_dim**0.25
    norm_x, norm_y = np.linalg.norm(x, axis=1), np.linalg.norm(y, axis=1)
    largest = float(max(norm_x.max(), norm_y.max()))
    exponent = largest * (math.sqrt(head_dim) + t) + largest**2 / 2  # the M of LIN-5.2
    a = math.exp((head_dim + 7) * u_a * exponent) * (1 + 2 * u_a) - 1
    rho = 2 * (a + u_d) + (m + n + 2) * u_a
    stabilisers = float(np.max(t * norm_x - norm_x**2 / 2) + np.max(t * norm_y - norm_y**2 / 2))
    log_smallest_value = math.log1p(-eta) + float(np.min(x @ y.T)) - max(stabilisers, 0.0)
    smallest_normal = UNDERFLOW_THRESHOLD["float64" if dtype == "float64" else "float32"]
    flushed = 4 * m * smallest_normal * math.exp(-log_smallest_value)
    smallest_weight = float(exact_weights(q, k).min()) * (1 - eta) / (1 + eta)
    floor = (m + n + 2) * UNDERFLOW_THRESHOLD[dtype] / smallest_weight
    bound: float = SAFETY_FACTOR * (2 * rho + 2 * u_a + u_d) + 2 * flushed + floor
    return bound


#: a_i and b_j lie in the ball of radius INPUT_RADIUS_FRACTION * r / 2, so that rounding the
#: inputs to any dtype of SDPA-1.4 keeps |x_i + y_j| <= r (checked after rounding).
INPUT_RADIUS_FRACTION = 0.9


def favor_inputs(
    n: int, head_dim: int, *, radius_sq: float = 0.25, offset_norm: float = 3.0, seed: int = 0
) -> tuple[Any, Any]:
    """Queries and keys ``(n, head_dim)`` in float64 with ``|x_i + y_j| <= 0.9 r``.

    ``x = c + a_i`` and ``y = -c + b_j`` with ``|c| = offset_norm``, ``a_i`` uniform in the
    ball of radius ``h = 0.9 sqrt(radius_sq) / 2`` and ``b_j = h (t_j c/|c| + sqrt(1 - t_j^2)
    u_j)`` with ``t_j`` evenly spaced in [-1, 1] and ``u_j`` a random unit vector orthogonal to
    ``c``: the keys' components along ``c`` span ``[-h, h]`` for every head dimension, which
    is what gives the test its power (LIN-6.2).  Returned as ``q = x E^(1/4)`` and
    ``k = y E^(1/4)``, so that ``q . k / sqrt(E) = x . y``.
    """
    rng = np.random.default_rng(seed)
    half_radius = INPUT_RADIUS_FRACTION * math.sqrt(radius_sq) / 2

    def unit(rows: int) -> Any:
        g = rng.standard_normal((rows, head_dim))
        return g / np.linalg.norm(g, axis=-1, keepdims=True)

    direction = unit(1)
    along = np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(1)
    across = unit(n)
    across -= (across @ direction.T) * direction  # orthogonal to c (nothing left when E = 1)
    norms = np.linalg.norm(across, axis=-1, keepdims=True)
    across = np.divide(across, norms, out=np.zeros_like(across), where=norms > 1e-12)
    b = half_radius * (along[:, None] * direction + np.sqrt(1 - along**2)[:, None] * across)
    a = unit(n) * half_radius * rng.random((n, 1)) ** (1 / head_dim)
    offset = offset_norm * direction
    root = head_dim**0.25
    return (offset + a) * root, (b - offset) * root


def uniform_weights_error(q: Any, k: Any) -> float:
    """A lower bound, over the rows, of ``max_j |(1/n)/P_ij - 1|``: the statistic of LIN-6.2
    for a kernel that returns uniform weights, whatever its redraws.

    A row whose scores span ``Delta`` has weights spanning ``e^Delta`` around their mean
    ``1/n``, so one of them is ``e^(Delta/2)`` away from it and the error is at least
    ``1 - e^(-Delta/2)``.
    """
    scores = q @ k.T / math.sqrt(q.shape[-1])
    spread = scores.max(axis=-1) - scores.min(axis=-1)
    return float(np.min(-np.expm1(-spread / 2)))


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
    rounded: Callable[[Any], Any] | None = None,
    dtype: str = "float64",
) -> FavorVerdict:
    """Run LIN-6.2 on ``estimate_weights(q, k, seed) -> P_hat``, the kernel seen through V = I.

    The inputs come from :func:`favor_inputs` with ``seed``, passed through ``rounded`` (the
    values a kernel in a lower precision receives; None: float64 as drawn); the target is the
    exact softmax of the rounded inputs, whose pairs are checked to satisfy
    ``|x_i + y_j|^2 <= radius_sq``.  The threshold is widened by the rounding a kernel
    computing in ``dtype`` may add (:func:`rounding_allowance`).  Redraw r passes the kernel
    the seed ``seed * R + r``.
    A kernel that follows LIN-4.3/LIN-4.4 with ``num_features`` features fails with
    probability at most ``false_failure``.
    """
    if not callable(estimate_weights):
        raise TypeError(f"estimate_weights={estimate_weights!r}, but should be callable [{CALL}]")
    head_dim = check_size("head_dim", head_dim, CALL, minimum=1)
    seed = check_size("seed", seed, CALL)
    if (
        isinstance(offset_norm, bool)
        or not isinstance(offset_norm, (int, float))
        or not (math.isfinite(offset_norm) and offset_norm >= 0)
    ):
        raise ValueError(f"offset_norm={offset_norm!r}, but should be finite and >= 0 [{CALL}]")
    bound = favor_threshold(n, num_features, radius_sq, false_failure)
    q, k = favor_inputs(n, head_dim, radius_sq=radius_sq, offset_norm=offset_norm, seed=seed)
    if rounded is not None:
        q, k = (np.asarray(rounded(a), dtype=np.float64) for a in (q, k))
    root = head_dim**0.25
    pair_sums = q[:, None, :] / root + k[None, :, :] / root
    largest = float(np.max(np.sum(pair_sums**2, axis=-1)))
    if largest > radius_sq:
        raise ValueError(
            f"the rounded inputs have |x_i + y_j|^2 = {largest:.6g}, but should be at most "
            f"radius_sq={radius_sq} for the threshold to hold [{CALL}]"
        )
    weights = exact_weights(q, k)
    kappa = rounding_allowance(q, k, num_features, dtype, bound.eta)
    threshold = bound.threshold + kappa * (1 + bound.threshold)
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
    passed = statistic <= threshold
    setting = (
        f"n={n}, E={head_dim}, m={num_features}, r^2={radius_sq}, R={bound.redraws}, "
        f"sigma={bound.sigma:.4g}, eta={bound.eta:.4g}, {dtype} rounding {kappa:.2g}, "
        f"seed={seed}"
    )
    if passed:
        message = (
            f"LIN-6.2 passed: the largest per-row median of max_j |P_hat/P - 1| is "
            f"{statistic:.4g} <= {threshold:.4g} ({setting})"
        )
    else:
        message = (
            f"LIN-6.2 failed: row {worst} has median max_j |P_hat/P - 1| = {statistic:.4g} > "
            f"{threshold:.4g} ({setting}); a correct FAVOR+ estimator with {num_features} "
            f"features fails with probability <= {bound.false_failure_bound:.3g}, so the "
            "kernel's weights are biased or noisier than its features allow"
        )
    return FavorVerdict(
        passed=passed,
        statistic=statistic,
        threshold=threshold,
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
    from ...reference.favor import favor_attention

    def estimate(q: Any, k: Any, seed: int) -> Any:
        identity = np.eye(k.shape[0])
        out = favor_attention(
            q[None],
            k[None],
            identity[None],
            num_features=num_features,
            seed=seed,
            orthogonal=orthogonal,
        )
        return np.asarray(out)[0]

    return estimate
