"""The accuracy clause of the backward pass as code: the bound of spec/backward.md (BWD-17).

Given the exact input values a kernel saw (q, k, v, the bias and the upstream gradients,
already rounded to its dtype) and the dtype it computed in, returns the float64 gradients
of BWD-1 and, for every gradient element, the largest error a kernel that follows BWD-14
can make, to first order in its roundings and times C = 4 (as TOL-2).  The derivation is
in the spec; this module only evaluates it, with matrix products, holding the
``Lq x Lk`` matrices of the problem (the bound is for tests, not for long sequences).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any, NamedTuple

from ._array import Array
from ._checks import namespace_of
from .backward import (
    CALL,
    _check_upstream,
    _grouped_lse_gradient,
    _grouped_rows,
    backward_steps,
    reduce_to_shape,
    scaled_dot_product_attention_backward,
)
from .features import check_dropout_p, log_sum_exp, softcapped
from .sdpa import allowed_scores, prepare, with_features
from .tolerance import (
    SAFETY_FACTOR,
    UNDERFLOW_THRESHOLD,
    UNIT_ROUNDOFF,
    _moved_weights_saturated,
    accumulation_roundoff,
    dropout_error_bound,
    error_and_lse_bound,
    feature_score_error,
    product_coefficient,
    scale_is_exact,
    tanh_roundoff,
)


class GradientBound(NamedTuple):
    """The float64 gradients of BWD-1 (each with its input's shape) and their allowed
    errors (BWD-17); ``dbias``/``dbias_tolerance`` are None without a bias."""

    dq: Any
    dk: Any
    dv: Any
    dbias: Any
    dq_tolerance: Any
    dk_tolerance: Any
    dv_tolerance: Any
    dbias_tolerance: Any


def _broadcast_factor(full: tuple[int, ...], shape: tuple[int, ...]) -> int:
    """How many elements of ``full`` one element of an array of ``shape`` broadcast to it
    stands for: the number of terms summed into one gradient element (BWD-2)."""
    return math.prod(full) // max(1, math.prod(shape)) if math.prod(shape) else 0


def gradient_error_bound(
    q: Array,
    k: Array,
    v: Array,
    grad_out: Array,
    *,
    dtype: str,
    grad_lse: Array = None,
    mask: Array = None,
    bias: Array = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    alibi_slopes: Array = None,
    dropout_p: float = 0.0,
    dropout_keep: Array = None,
) -> GradientBound:
    """BWD-17 for float64 inputs holding values exactly representable in ``dtype``.

    Arguments are those of :func:`~.backward.scaled_dot_product_attention_backward`.
    The forward's errors enter as TOL-2's and TOL-5's bounds divided by C (their first-order
    brackets): the weights' and the log-sum-exp's, for the weights the backward recomputes
    and for the output D = rowsum(dO * O) is formed from.
    """
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype={dtype!r}, but should be one of {tuple(UNIT_ROUNDOFF)}")
    namespace_of(CALL, q=q, grad_out=grad_out, grad_lse=grad_lse)
    dropout_p = check_dropout_p(dropout_p, CALL)
    options: dict[str, Any] = dict(
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        scale=scale,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
    )
    gradients = scaled_dot_product_attention_backward(
        q,
        k,
        v,
        grad_out,
        grad_lse=grad_lse,
        dropout_p=dropout_p,
        dropout_keep=dropout_keep,
        **options,
    )
    forward, lse_bound = error_and_lse_bound(q, k, v, dtype=dtype, weights=False, **options)
    out = forward.out
    if dropout_keep is not None:  # the dropped output (DROP-2), whose rounding D charges
        out, _ = dropout_error_bound(
            q, k, v, dtype=dtype, dropout_p=dropout_p, dropout_keep=dropout_keep, **options
        )
    problem = prepare(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        scale=scale,
        call=CALL,
    )
    problem = with_features(
        problem,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        causal_alignment=causal_alignment,
        call=CALL,
    )
    xp = problem.xp
    if problem.q.dtype != xp.float64:
        raise TypeError(f"gradient_error_bound needs float64 inputs, got {problem.q.dtype}")
    _check_upstream(xp, "grad_out", grad_out, problem.out_shape, CALL)
    d_out = _grouped_rows(problem, grad_out)
    d_lse = _grouped_lse_gradient(problem, grad_lse, CALL)
    steps = backward_steps(problem, d_out, d_lse, dropout_p, dropout_keep, CALL)

    u_d, u_a = UNIT_ROUNDOFF[dtype], accumulation_roundoff(dtype)
    sigma = UNDERFLOW_THRESHOLD[dtype]
    allowed = xp.astype(steps.allowed, xp.float64)
    n_keys, value_dim = problem.k.shape[-2], problem.v.shape[-1]
    head_dim = problem.q.shape[-1]
    weights = steps.weights

    # A weight the backward pass uses is p_ij (1 + e_ij - c_i): e_ij its own score error,
    # rounding and underflow, at most g^_ij / p_ij; c_i a shift common to the row (the
    # log-sum-exp's error, or the renormalisation), at most gamma_i = tau^l_i / C (TOL-5)
    key_error = _key_weight_error(problem, dtype, weights, steps.allowed)
    gamma = _grouped_rows(problem, lse_bound.lse_tolerance[..., None]) / SAFETY_FACTOR
    abs_out = xp.abs(_grouped_rows(problem, out))
    abs_d_out = xp.abs(d_out)
    rescale = xp.ones_like(weights) if steps.rescale is None else steps.rescale
    abs_dp = xp.abs(steps.grad_weights) * allowed
    products = xp.matmul(abs_d_out, xp.matrix_transpose(xp.abs(problem.v)))  # A^v_ij
    # eps^P: the dot product dO_i . v_j accumulated (E_v + 2) u_a, dP rounded to the dtype
    eps_p = allowed * ((value_dim + 2) * u_a * rescale * products + u_d * abs_dp)
    abs_delta = xp.abs(steps.delta)
    # G_i, D's error: sum_j p_ij e'_ij dP_ij - c'_i D_i from the weights it is formed with,
    # plus the roundings of either form: sum_j p^_ij dP^_ij (a softmax backward), or
    # dO_i . o^_i from the forward's output (FlashAttention: its P V sum, its rounding to
    # the dtype and the dot product)
    weighted = xp.sum(
        key_error * abs_dp
        + weights * (eps_p + (n_keys + 1) * u_a * abs_dp + (n_keys + 2) * u_a * rescale * products),
        axis=-1,
        keepdims=True,
    )
    out_rounding = (u_d + (value_dim + 1) * u_a) * xp.sum(
        abs_d_out * abs_out, axis=-1, keepdims=True
    )
    delta_error = weighted + gamma * abs_delta + out_rounding
    abs_lse_grad = xp.zeros_like(delta_error) if d_lse is None else xp.abs(d_lse)
    shifted = steps.grad_weights - steps.delta + (0.0 if d_lse is None else d_lse)
    abs_ds = xp.abs(steps.grad_scores)
    # eps^S without D's error and the row's shift, which are common to the row
    own_error = allowed * (
        key_error * xp.abs(shifted)
        + weights * (eps_p + 3 * u_a * (abs_dp + abs_delta + abs_lse_grad))
        + u_d * abs_ds
        + sigma
    )
    scale_rounding = 0.0 if scale_is_exact(problem.scale) else 4 * u_d
    factor, abs_dx, eps_x = None, abs_ds, own_error
    if problem.softcap is not None:
        factor, eps_x, abs_dx = _through_softcap(
            xp, problem, dtype, abs_ds, own_error, scale_rounding
        )
    capped_weights = weights if factor is None else factor * weights  # kappa_ij p_ij
    # the whole error of dS (dX), for dk and the bias: its own, D's, the row's shift
    eps_x_all = eps_x + capped_weights * delta_error + gamma * abs_dx
    eps_s_all = own_error + weights * delta_error + gamma * abs_ds

    alpha = abs(problem.scale)
    abs_q, abs_k = xp.abs(problem.q), xp.abs(problem.k)
    scores_shape = (*problem.out_shape[:-1], n_keys)
    n_q = n_keys * _broadcast_factor(problem.out_shape[:-3], tuple(q.shape[:-3]))
    n_kv_rows = problem.q.shape[-3] * problem.q.shape[-2]
    n_k = n_kv_rows * _broadcast_factor(problem.out_shape[:-3], tuple(k.shape[:-3]))
    n_v = n_kv_rows * _broadcast_factor(problem.out_shape[:-3], tuple(v.shape[:-3]))

    # dq_i = alpha sum_j dX_ij k_j: D's error and the shift are common to the row, so they
    # move dq_i by alpha |sum_j kappa_ij p_ij k_j| G_i and gamma_i |dq_i|
    grouped_dq = (
        xp.matmul(steps.grad_scores if factor is None else steps.grad_scores * factor, problem.k)
        * problem.scale
    )
    eps_q = (
        alpha * xp.matmul(eps_x, abs_k)
        + alpha * xp.abs(xp.matmul(capped_weights, problem.k)) * delta_error
        + gamma * xp.abs(grouped_dq)
        + (scale_rounding + (n_q + 2) * u_a) * alpha * xp.matmul(abs_dx, abs_k)
    )
    eps_k = alpha * xp.sum(xp.matmul(xp.matrix_transpose(eps_x_all), abs_q), axis=-3) + (
        scale_rounding + (n_k + 2) * u_a
    ) * alpha * xp.sum(xp.matmul(xp.matrix_transpose(abs_dx), abs_q), axis=-3)
    weight_error = key_error + weights * gamma
    eps_v = xp.sum(
        xp.matmul(xp.matrix_transpose(rescale * weight_error), abs_d_out)
        + (n_v + 3) * u_a * xp.matmul(xp.matrix_transpose(xp.abs(steps.kept)), abs_d_out),
        axis=-3,
    )

    def tolerance(eps: Any, like: Any, gradient: Any, terms: int) -> Any:
        summed = reduce_to_shape(xp, xp.reshape(eps, like), tuple(gradient.shape))
        return SAFETY_FACTOR * (summed + u_d * xp.abs(gradient)) + (terms + 2) * sigma

    batch = problem.out_shape[:-3]
    q_like = (*problem.out_shape[:-1], head_dim)
    kv_like = (*batch, problem.k.shape[-4], n_keys)
    dq_tolerance = tolerance(eps_q, q_like, gradients.dq, n_q)
    dk_tolerance = tolerance(eps_k, (*kv_like, head_dim), gradients.dk, n_k)
    dv_tolerance = tolerance(eps_v, (*kv_like, value_dim), gradients.dv, n_v)
    dbias_tolerance = None
    if bias is not None:
        n_b = _broadcast_factor(scores_shape, tuple(bias.shape))
        eps_b = xp.reshape(eps_s_all, scores_shape) + (n_b + 2) * u_a * xp.reshape(
            abs_ds, scores_shape
        )
        dbias_tolerance = tolerance(eps_b, scores_shape, gradients.dbias, n_b)
    return GradientBound(
        dq=gradients.dq,
        dk=gradients.dk,
        dv=gradients.dv,
        dbias=gradients.dbias,
        dq_tolerance=dq_tolerance,
        dk_tolerance=dk_tolerance,
        dv_tolerance=dv_tolerance,
        dbias_tolerance=dbias_tolerance,
    )


def _key_weight_error(problem: Any, dtype: str, weights: Any, allowed: Any) -> Any:
    """g^_ij: a weight's error from its own score (TOL-2's g_ij = p_ij (e^Delta'_ij - 1),
    Delta' with TOL-4's feature terms), its rounding to the dtype (u_d p_ij) and its underflow
    (sigma_d); 0 outside S(i), where every weight is exactly 0 (BWD-3)."""
    xp = problem.xp
    u_d, u_a = UNIT_ROUNDOFF[dtype], accumulation_roundoff(dtype)
    scores, _ = allowed_scores(problem)
    zero = xp.zeros_like(scores)
    n_keys = scores.shape[-1]
    row_max = xp.max(scores, axis=-1, keepdims=True) if n_keys else scores[..., :1]
    row_max = xp.where(xp.isfinite(row_max), row_max, xp.zeros_like(row_max))
    gap = xp.where(allowed, row_max - scores, zero)
    alpha = abs(problem.scale)
    magnitude = alpha * xp.matmul(xp.abs(problem.q), xp.matrix_transpose(xp.abs(problem.k)))
    head_dim = problem.q.shape[-1]
    scale = problem.scale
    delta = product_coefficient(dtype, head_dim, scale) * magnitude + 3 * u_a * gap + 6 * u_a
    if problem.bias is not None:
        delta = delta + 2 * u_a * xp.abs(problem.bias)
    if problem.softcap is not None or problem.alibi is not None:
        capped = None
        if problem.softcap is not None:
            raw = xp.matmul(problem.q, xp.matrix_transpose(problem.k)) * problem.scale
            capped = softcapped(xp, raw, problem.softcap)
        delta = delta + feature_score_error(
            xp, dtype, magnitude, capped, problem.bias, problem.alibi
        )
    delta = xp.where(allowed, delta, zero)
    lse = log_sum_exp(xp, scores, allowed)[..., None]
    finite_lse = xp.where(xp.isfinite(lse), lse, xp.zeros_like(lse))
    log_weights = xp.where(allowed, scores - finite_lse, xp.full_like(scores, -xp.inf))
    moved = _moved_weights_saturated(xp, weights, log_weights, delta, allowed)
    sigma = UNDERFLOW_THRESHOLD[dtype]
    return xp.where(allowed, moved + u_d * weights + sigma, zero)


def _through_softcap(
    xp: ModuleType, problem: Any, dtype: str, abs_ds: Any, eps_s: Any, scale_rounding: float
) -> tuple[Any, Any, Any]:
    """eps^X and |dX| of dX = dS (1 - tanh^2(x / c)) (BWD-7): dS's error times the factor,
    plus |dS| times the factor's error, from the scaled product's error (the products and
    the division by the cap) through tanh (u_t) and the square and subtraction (2 u_a),
    plus the product rounded to the dtype (u_d).  Returns (1 - tanh^2, eps^X, |dX|)."""
    u_d, u_a = UNIT_ROUNDOFF[dtype], accumulation_roundoff(dtype)
    cap = problem.softcap
    x = xp.matmul(problem.q, xp.matrix_transpose(problem.k)) * problem.scale
    slope = xp.tanh(x / cap)
    factor = 1 - slope * slope
    head_dim = problem.q.shape[-1]
    magnitude = abs(problem.scale) * xp.matmul(
        xp.abs(problem.q), xp.matrix_transpose(xp.abs(problem.k))
    )
    x_error = (scale_rounding + (head_dim + 5) * u_a) * magnitude
    factor_error = (
        2 * xp.abs(slope) * (factor * x_error / cap + tanh_roundoff(dtype) * xp.abs(slope))
        + 2 * u_a
    )
    abs_dx = factor * abs_ds
    return factor, factor * eps_s + factor_error * abs_ds + u_d * abs_dx, abs_dx
