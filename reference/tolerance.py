"""The accuracy clause as code: the a-priori error bound of spec/tolerance.md (TOL-2).

Given the exact input values a kernel saw and the dtype it computed in, returns the
float64 evaluation of the definition and, for every output element, the largest error
a kernel that follows SDPA-7.2 can make.  The derivation is in the spec; this module
only evaluates it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .sdpa import allowed_scores, prepare, softmax_over_allowed, weighted_values

UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}
# sigma_d of TOL-2: the dtype's smallest subnormal, or the smallest normal of the format the
# kernel computes in when that is larger, so flush-to-zero arithmetic (GPUs, XLA on CPU) conforms
UNDERFLOW_THRESHOLD = {
    "float16": 2.0**-24, "bfloat16": 2.0**-126, "float32": 2.0**-126, "float64": 2.0**-1022,
}
SAFETY_FACTOR = 4.0  # TOL-2: 2 for second-order terms, times 2 for the oracle's own error


class ErrorBound(NamedTuple):
    """``out`` and ``weights`` of the definition in float64, with their allowed errors."""

    out: Any
    out_tolerance: Any
    weights: Any
    weights_tolerance: Any


def accumulation_roundoff(dtype: str) -> float:
    """u_a of TOL-2: float32's for half precision inputs (SDPA-7.2), else the dtype's."""
    return min(UNIT_ROUNDOFF[dtype], UNIT_ROUNDOFF["float32"])


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
) -> ErrorBound:
    """TOL-2 for inputs given in float64 holding values exactly representable in ``dtype``.

    Shapes follow SDPA-1.1; ``out``/``out_tolerance`` are ``(..., Hq, Lq, Ev)`` and
    ``weights``/``weights_tolerance`` are ``(..., Hq, Lq, Lk)``.  Where the definition
    is not finite the tolerance is 0: the kernel must match it exactly (TOL-3).
    """
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype={dtype!r}, but should be one of {tuple(UNIT_ROUNDOFF)}")
    problem = prepare(
        q, k, v, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, call="error_bound(q, k, v)",
    )
    xp = problem.xp
    if problem.q.dtype != xp.float64:
        raise TypeError(f"error_bound needs float64 inputs, got {problem.q.dtype}")
    u_d, u_a = UNIT_ROUNDOFF[dtype], accumulation_roundoff(dtype)
    head_dim, n_keys = problem.q.shape[-1], problem.k.shape[-2]

    scores, allowed = allowed_scores(problem)
    weights = softmax_over_allowed(xp, scores, allowed)
    out = weighted_values(xp, weights, allowed, problem.v)

    zero = xp.zeros_like(weights)
    magnitude = xp.matmul(xp.abs(problem.q), xp.matrix_transpose(xp.abs(problem.k)))
    score_error = (3 * u_d + (head_dim + 4) * u_a) * abs(problem.scale) * magnitude
    if problem.bias is not None:
        score_error = score_error + 2 * u_d * xp.abs(xp.where(allowed, problem.bias, zero))
    score_error = xp.where(allowed, score_error, zero)
    if n_keys:
        row_score_error = xp.max(score_error, axis=-1, keepdims=True) + 4 * u_a
    else:
        row_score_error = xp.zeros((*scores.shape[:-1], 1), dtype=scores.dtype)

    finite_v = xp.where(xp.isfinite(problem.v), problem.v, xp.zeros_like(problem.v))
    finite_out = xp.where(xp.isfinite(out), out, xp.zeros_like(out))
    weighted_abs = xp.matmul(weights, xp.abs(finite_v))
    spread = xp.sum(
        weights[..., None] * xp.abs(finite_v[..., None, :, :] - finite_out[..., :, None, :]),
        axis=-2,
    )
    sigma = UNDERFLOW_THRESHOLD[dtype]
    floor = (n_keys + 2) * sigma
    # a weight rounded on the subnormal grid errs by sigma in absolute terms, times |v_jc|
    allowed_abs_values = xp.matmul(xp.astype(allowed, weights.dtype), xp.abs(finite_v))
    # score errors <= delta move a normalised output by at most (e^{2 delta} - 1)/2 * spread,
    # and weights not renormalised (log-sum-exp, split-KV combines) by (e^delta - 1) * M
    out_tolerance = SAFETY_FACTOR * (
        xp.expm1(2 * row_score_error) / 2 * spread
        + xp.expm1(row_score_error) * weighted_abs
        + (u_d + (n_keys + 2) * u_a) * weighted_abs
        + u_d * xp.abs(finite_out)
    ) + floor + sigma * allowed_abs_values
    out_tolerance = xp.where(xp.isfinite(out), out_tolerance, xp.zeros_like(out))
    weights_tolerance = SAFETY_FACTOR * (xp.expm1(2 * row_score_error) + u_d) * weights + floor

    out_shape, weights_shape = problem.out_shape, (*problem.out_shape[:-1], n_keys)
    return ErrorBound(
        out=xp.reshape(out, out_shape),
        out_tolerance=xp.reshape(out_tolerance, out_shape),
        weights=xp.reshape(weights, weights_shape),
        weights_tolerance=xp.reshape(weights_tolerance, weights_shape),
    )
