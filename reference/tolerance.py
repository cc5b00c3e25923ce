"""The accuracy clause as code: the a-priori error bound of spec/tolerance.md (TOL-2).

Given the exact input values a kernel saw and the dtype it computed in, returns the
float64 evaluation of the definition and, for every output element, the largest error
a kernel that follows SDPA-7.2 can make.  The derivation is in the spec; this module
only evaluates it, in chunks of query rows (rows are independent), with matrix products
only, so that the bound of a realistic problem costs about as much as the attention
itself and its memory stays bounded.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any, NamedTuple

from .sdpa import AttentionProblem, allowed_scores, prepare, weighted_values

UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}
# sigma_d of TOL-2: the dtype's smallest subnormal, or the smallest normal of the format the
# kernel computes in when that is larger, so flush-to-zero arithmetic (GPUs, XLA on CPU) conforms
UNDERFLOW_THRESHOLD = {
    "float16": 2.0**-24, "bfloat16": 2.0**-126, "float32": 2.0**-126, "float64": 2.0**-1022,
}
SAFETY_FACTOR = 4.0  # TOL-2: 2 for second-order terms, times 2 for the oracle's own error
# Score-error terms beyond this can only reach the hull cap of TOL-2, so larger values need
# not be represented (and exp never overflows).
_SATURATED_WEIGHT_ERROR = 2.0
# Elements of one (rows x keys) chunk: ~16 MB per float64 temporary.
CHUNK_ELEMENTS = 2**21


class ErrorBound(NamedTuple):
    """``out`` and ``weights`` of the definition in float64, with their allowed errors.

    ``weights`` and ``weights_tolerance`` are None unless asked for (they are the size of
    the score matrix).  ``score_error`` is D_i of TOL-2 per query row ``(..., Hq, Lq)``:
    the relative change of the row's weights that the allowed score errors can cause;
    ``attends`` is True for rows with at least one allowed key.
    """

    out: Any
    out_tolerance: Any
    weights: Any
    weights_tolerance: Any
    score_error: Any
    attends: Any


def accumulation_roundoff(dtype: str) -> float:
    """u_a of TOL-2: float32's for half precision inputs (SDPA-7.2), else the dtype's."""
    return min(UNIT_ROUNDOFF[dtype], UNIT_ROUNDOFF["float32"])


def product_coefficient(dtype: str, head_dim: int, scale: float | None = None) -> float:
    """TOL-2's coefficient of |alpha| A_ij in the score error Delta_ij: r_alpha + (E + 4)u_a,
    r_alpha = 4u_d unless applying the scale is exact (``scale_is_exact``), then 0."""
    alpha = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    scale_rounding = 0.0 if scale_is_exact(alpha) else 4 * UNIT_ROUNDOFF[dtype]
    return scale_rounding + (head_dim + 4) * accumulation_roundoff(dtype)


def scale_is_exact(alpha: float) -> bool:
    """True when sqrt(|alpha|) is a power of two (or alpha is 0): then alpha and sqrt(alpha)
    are exact in every dtype and multiplying an operand by either is exact (TOL-2)."""
    root = math.sqrt(abs(alpha))
    return alpha == 0 or (root * root == abs(alpha) and math.frexp(root)[0] == 0.5)


def error_bound(
    q: Any,
    k: Any,
    v: Any,
    *,
    dtype: str,
    mask: Any = None,
    bias: Any = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    weights: bool = True,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> ErrorBound:
    """TOL-2 for inputs given in float64 holding values exactly representable in ``dtype``.

    Shapes follow SDPA-1.1; ``out``/``out_tolerance`` are ``(..., Hq, Lq, Ev)`` and
    ``weights``/``weights_tolerance`` are ``(..., Hq, Lq, Lk)``.  Where the definition
    is not finite the tolerance is 0: the kernel must match it exactly (TOL-3).
    ``weights=False`` skips the weights (for large problems); ``chunk_elements`` bounds the
    size of the (rows x keys) blocks evaluated at once, and so the memory used.
    """
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype={dtype!r}, but should be one of {tuple(UNIT_ROUNDOFF)}")
    if isinstance(chunk_elements, bool) or not isinstance(chunk_elements, int) \
            or chunk_elements < 1:
        raise ValueError(f"chunk_elements={chunk_elements!r}, but should be a positive int")
    problem = prepare(
        q, k, v, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, call="error_bound(q, k, v)",
    )
    xp = problem.xp
    if problem.q.dtype != xp.float64:
        raise TypeError(f"error_bound needs float64 inputs, got {problem.q.dtype}")
    *grouped, n_queries, _ = problem.q.shape
    n_keys = problem.k.shape[-2]
    rows_per_chunk = max(1, chunk_elements // max(1, math.prod(grouped) * n_keys))
    starts = range(0, n_queries, rows_per_chunk) if n_queries else [0]
    parts = [
        _chunk_bound(problem, start, min(start + rows_per_chunk, n_queries), dtype, weights)
        for start in starts
    ]
    out_shape, weights_shape = problem.out_shape, (*problem.out_shape[:-1], n_keys)
    shapes = (out_shape, out_shape, weights_shape, weights_shape, out_shape[:-1], out_shape[:-1])
    whole = [
        None if pieces[0] is None else xp.reshape(
            xp.concat(list(pieces), axis=-2) if len(parts) > 1 else pieces[0], shape)
        for pieces, shape in zip(zip(*parts, strict=True), shapes, strict=True)
    ]
    return ErrorBound(*whole)


def _rows(a: Any, start: int, stop: int) -> Any:
    """Query rows ``start:stop`` of an array that is (or broadcasts) ``(..., Lq, ·)``."""
    return a if a is None or a.shape[-2] == 1 else a[..., start:stop, :]


def _chunk_bound(
    problem: AttentionProblem, start: int, stop: int, dtype: str, with_weights: bool,
) -> tuple[Any, ...]:
    """(out, tau, p, tau^p, D, attends) of TOL-2 for query rows ``start:stop``, grouped
    layout; p and tau^p are None unless ``with_weights``."""
    xp = problem.xp
    chunk = problem._replace(
        q=problem.q[..., start:stop, :],
        allowed=_rows(problem.allowed, start, stop),
        bias=_rows(problem.bias, start, stop),
    )
    u_d, u_a = UNIT_ROUNDOFF[dtype], accumulation_roundoff(dtype)
    n_keys, head_dim = chunk.k.shape[-2], chunk.q.shape[-1]
    scores, allowed = allowed_scores(chunk)
    zero = xp.zeros_like(scores)
    row_max = xp.max(scores, axis=-1, keepdims=True) if n_keys else scores[..., :1]
    row_max = xp.where(xp.isfinite(row_max), row_max, xp.zeros_like(row_max))
    gap = xp.where(allowed, row_max - scores, zero)  # >= 0: the shifted score's size
    exps = xp.where(allowed, xp.exp(-gap), zero)
    total = xp.sum(exps, axis=-1, keepdims=True)
    total = xp.where(total == 0, xp.ones_like(total), total)
    weights = exps / total
    log_weights = xp.where(allowed, -gap - xp.log(total), xp.full_like(scores, -xp.inf))
    out = weighted_values(xp, weights, allowed, chunk.v)

    # Delta_ij: the largest error of the computed shifted score of an allowed key.
    magnitude = xp.matmul(xp.abs(chunk.q), xp.matrix_transpose(xp.abs(chunk.k)))
    delta = product_coefficient(dtype, head_dim, chunk.scale) * abs(chunk.scale) * magnitude \
        + 3 * u_a * gap + 6 * u_a
    if chunk.bias is not None:
        delta = delta + 2 * u_a * xp.abs(chunk.bias)
    delta = xp.where(allowed, delta, zero)
    # g_ij = p_ij (e^Delta_ij - 1): accurate for small Delta, and e^(log p + Delta) where p
    # underflows but a perturbed weight need not (a key padded with a large finite bias).
    small = delta < 1
    moved = xp.where(
        small, weights * xp.expm1(xp.where(small, delta, zero)),
        xp.exp(xp.minimum(log_weights + delta, xp.ones_like(delta))) - weights,
    )
    moved = xp.where(allowed, xp.minimum(moved, xp.full_like(moved, _SATURATED_WEIGHT_ERROR)),
                     zero)
    score_error = xp.sum(moved, axis=-1, keepdims=True)  # D_i
    determined = score_error < 1
    amplification = 1 / xp.where(determined, 1 - score_error, xp.ones_like(score_error))

    finite_v = xp.where(xp.isfinite(chunk.v), chunk.v, xp.zeros_like(chunk.v))
    abs_v = xp.abs(finite_v)
    finite_out = xp.where(xp.isfinite(out), out, xp.zeros_like(out))
    abs_out = xp.abs(finite_out)
    weighted_abs = xp.matmul(weights, abs_v)  # M_ic
    moved_abs, moved_v, moved_v2 = (xp.matmul(moved, a) for a in (abs_v, finite_v,
                                                                   finite_v * finite_v))
    # sum_j g_ij |v_jc - o_ic| <= min(triangle inequality, Cauchy-Schwarz)
    by_triangle = moved_abs + score_error * abs_out
    quadratic = moved_v2 - 2 * finite_out * moved_v + score_error * finite_out * finite_out
    quadratic_rounding = 4 * UNIT_ROUNDOFF["float64"] * (
        moved_v2 + 2 * abs_out * moved_abs + score_error * finite_out * finite_out)
    by_cauchy_schwarz = xp.sqrt(score_error * (xp.maximum(quadratic, xp.zeros_like(quadratic))
                                               + quadratic_rounding))
    spread = xp.minimum(by_triangle, by_cauchy_schwarz)
    renormalised = xp.where(determined, spread * amplification, xp.full_like(spread, xp.inf))
    hull = _hull_radius(xp, finite_v, finite_out)
    score_part = xp.minimum(renormalised + moved_abs, 2 * hull)

    sigma = UNDERFLOW_THRESHOLD[dtype]
    floor = (n_keys + 2) * sigma
    allowed_abs_values = xp.matmul(xp.astype(allowed, weights.dtype), abs_v)
    out_tolerance = SAFETY_FACTOR * (
        score_part + (u_d + (n_keys + 2) * u_a) * weighted_abs + u_d * abs_out
    ) + floor + sigma * allowed_abs_values
    out_tolerance = xp.where(xp.isfinite(out), out_tolerance, xp.zeros_like(out))
    attends = xp.any(allowed, axis=-1, keepdims=True)
    if not with_weights:
        return out, out_tolerance, None, None, score_error, attends
    weight_change = xp.where(
        determined, (moved + weights * score_error) * amplification, xp.ones_like(moved))
    weights_tolerance = SAFETY_FACTOR * (
        xp.minimum(weight_change, xp.ones_like(moved)) + u_d * weights) + floor
    return out, out_tolerance, weights, weights_tolerance, score_error, attends


def _hull_radius(xp: ModuleType, v: Any, out: Any) -> Any:
    """max(hi_c - o_ic, o_ic - lo_c) over the finite values of each key/value head: no
    convex combination of values is farther than this from the output."""
    if v.shape[-2] == 0:
        return xp.zeros_like(out)
    high = xp.max(v, axis=-2, keepdims=True)
    low = xp.min(v, axis=-2, keepdims=True)
    return xp.maximum(high - out, out - low)
