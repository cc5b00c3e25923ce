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
from typing import TYPE_CHECKING, Any, NamedTuple

from ._array import Array
from ._checks import namespace_of
from .backward import (
    CALL,
    BackwardOptions,
    _check_upstream,
    _grouped_lse_gradient,
    _grouped_rows,
    backward_steps,
    reduce_to_shape,
)
from .features import check_dropout_p, log_sum_exp, softcapped
from .options import ScoreOptions, filled, shows_options
from .sdpa import GroupedInputs, allowed_scores, prepare_with_features
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
    scale_rounding,
    tanh_roundoff,
)

if TYPE_CHECKING:
    from typing import Unpack


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


class GradientBoundOptions(BackwardOptions, total=False):
    """The keywords of the backward's bound (BWD-17) beside ``dtype``."""

    chunk_elements: int


@shows_options(GradientBoundOptions)
def gradient_error_bound(
    q: Array,
    k: Array,
    v: Array,
    grad_out: Array,
    *,
    dtype: str,
    **given: Unpack[GradientBoundOptions],
) -> GradientBound:
    """BWD-17 for float64 inputs holding values exactly representable in ``dtype``.

    Arguments are those of :func:`~.backward.scaled_dot_product_attention_backward`.
    The forward's errors enter as TOL-2's and TOL-5's bounds divided by C (their first-order
    brackets): the weights' and the log-sum-exp's, for the weights the backward recomputes
    and for the output D = rowsum(dO * O) is formed from.  The terms are evaluated over
    chunks of query rows of about ``chunk_elements`` scores (rows are independent; dk, dv
    and a row-less bias gradient add up over them), so memory stays bounded by the chunk.
    """
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype={dtype!r}, but should be one of {tuple(UNIT_ROUNDOFF)}")
    settings = filled(GradientBoundOptions, given)
    grad_lse, dropout_keep = settings["grad_lse"], settings["dropout_keep"]
    namespace_of(CALL, q=q, grad_out=grad_out, grad_lse=grad_lse)
    dropout_p = check_dropout_p(settings["dropout_p"], CALL)
    options = filled(ScoreOptions, settings)
    bias = options["bias"]
    forward, lse_bound = error_and_lse_bound(q, k, v, dtype=dtype, weights=False, **options)
    out = forward.out
    if dropout_keep is not None:  # the dropped output (DROP-2), whose rounding D charges
        out, _ = dropout_error_bound(
            q, k, v, dtype=dtype, dropout_p=dropout_p, dropout_keep=dropout_keep, **options
        )
    problem = prepare_with_features(q, k, v, options, CALL)
    xp = problem.xp
    if problem.q.dtype != xp.float64:
        raise TypeError(f"gradient_error_bound needs float64 inputs, got {problem.q.dtype}")
    _check_upstream(xp, "grad_out", grad_out, problem.out_shape, CALL)
    rows = _Rows(
        d_out=_grouped_rows(problem, grad_out),
        d_lse=_grouped_lse_gradient(problem, grad_lse, CALL),
        out=_grouped_rows(problem, out),
        gamma=_grouped_rows(problem, lse_bound.lse_tolerance[..., None]) / SAFETY_FACTOR,
        keep=dropout_keep,
    )
    n_keys = problem.k.shape[-2]
    batch = problem.out_shape[:-3]
    n_kv_rows = problem.q.shape[-3] * problem.q.shape[-2]
    counts = _Counts(
        q=n_keys * _broadcast_factor(batch, tuple(q.shape[:-3])),
        k=n_kv_rows * _broadcast_factor(batch, tuple(k.shape[:-3])),
        v=n_kv_rows * _broadcast_factor(batch, tuple(v.shape[:-3])),
        bias=0
        if bias is None
        else _broadcast_factor((*problem.out_shape[:-1], n_keys), tuple(bias.shape)),
    )
    n_queries = problem.q.shape[-2]
    per_row = max(1, math.prod(problem.q.shape[:-2]) * n_keys)
    step = max(1, settings["chunk_elements"] // per_row)
    parts = [
        _chunk_terms(
            problem,
            rows,
            slice(start, min(start + step, n_queries)),
            dtype,
            dropout_p,
            counts,
            None if bias is None else tuple(bias.shape),
        )
        for start in (range(0, n_queries, step) if n_queries else [0])
    ]
    return _assembled(problem, parts, q, k, v, bias, dtype, counts)


class _Rows(NamedTuple):
    """Per query row, grouped ``(*batch, Hkv, G, Lq, ·)``: dO, dl (or None), the forward's
    output and gamma_i; and the keep mask as given (or None)."""

    d_out: Any
    d_lse: Any
    out: Any
    gamma: Any
    keep: Any


class _Counts(NamedTuple):
    """N_Q, N_K, N_V, N_B of BWD-17: the terms summed into one gradient element."""

    q: int
    k: int
    v: int
    bias: int


class _Part(NamedTuple):
    """One chunk of query rows' share of the gradients and of their errors: dq and eps^Q of
    its rows (grouped); its sums into dk, dv (over its rows and the group) with their two
    error terms each (own errors, and the magnitudes the accumulation rounding scales); and
    its part of the bias gradient with its errors (None without a bias)."""

    dq: Any
    eps_q: Any
    dk: Any
    eps_k: Any
    abs_k: Any
    dv: Any
    eps_v: Any
    abs_v: Any
    dbias: Any
    eps_b: Any


def _sliced(a: Any, rows: slice) -> Any:
    """Query rows ``rows`` of an array that is (or broadcasts) ``(..., Lq, ·)``."""
    return a if a is None or a.ndim < 2 or a.shape[-2] == 1 else a[..., rows, :]


def _chunk_terms(
    problem: GroupedInputs,
    rows_of: _Rows,
    rows: slice,
    dtype: str,
    dropout_p: float,
    counts: _Counts,
    bias_shape: tuple[int, ...] | None,
) -> _Part:
    """BWD-17's terms for query rows ``rows`` of every batch element and head."""
    xp = problem.xp
    chunk = problem._replace(
        q=problem.q[..., rows, :],
        allowed=_sliced(problem.allowed, rows),
        bias=_sliced(problem.bias, rows),
        alibi=_sliced(problem.alibi, rows),
    )
    d_out, d_lse = rows_of.d_out[..., rows, :], _sliced(rows_of.d_lse, rows)
    gamma, out = rows_of.gamma[..., rows, :], rows_of.out[..., rows, :]
    steps = backward_steps(chunk, d_out, d_lse, dropout_p, _sliced(rows_of.keep, rows), CALL)

    u_d, u_a = UNIT_ROUNDOFF[dtype], accumulation_roundoff(dtype)
    sigma = UNDERFLOW_THRESHOLD[dtype]
    allowed = xp.astype(steps.allowed, xp.float64)
    n_keys, value_dim = chunk.k.shape[-2], chunk.v.shape[-1]
    weights = steps.weights

    # A weight the backward pass uses is p_ij (1 + e_ij - c_i): e_ij its own score error,
    # rounding and underflow, at most g^_ij / p_ij; c_i a shift common to the row (the
    # log-sum-exp's error, or the renormalisation), at most gamma_i = tau^l_i / C (TOL-5)
    key_error, moved = _key_weight_error(chunk, dtype, weights, steps.allowed)
    abs_out = xp.abs(out)
    abs_d_out = xp.abs(d_out)
    rescale = xp.ones_like(weights) if steps.rescale is None else steps.rescale
    abs_dp = xp.abs(steps.grad_weights) * allowed
    products = xp.matmul(abs_d_out, xp.matrix_transpose(xp.abs(chunk.v)))  # A^v_ij
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
    r_alpha = scale_rounding(dtype)  # TOL-2's, at every scale (E-2026.12-14)
    factor, abs_dx, eps_x = None, abs_ds, own_error
    if chunk.softcap is not None:
        factor, eps_x, abs_dx = _through_softcap(xp, chunk, dtype, abs_ds, own_error, r_alpha)
    capped_weights = weights if factor is None else factor * weights  # kappa_ij p_ij
    grad_x = steps.grad_scores if factor is None else steps.grad_scores * factor
    # the whole error of dS (dX), for dk and the bias: its own, D's, the row's shift
    eps_x_all = eps_x + capped_weights * delta_error + gamma * abs_dx
    eps_s_all = own_error + weights * delta_error + gamma * abs_ds

    # BWD-17's second bound: a row beyond the first-order model (undetermined, g_i >= 1/4)
    # may have any weights in [0, 1] over S(i); its first-order terms are not valid there
    # (and charge the rounding of s + finfo.min where its keys carry that bias), so the
    # second bound takes their place on such a row: span_i bounds the kernel's
    # |dP_ij - D_i + dl_i| for all of them
    undetermined = _undetermined_rows(xp, moved)

    def first_order(a: Any) -> Any:  # 0 on undetermined rows, whatever a is there
        return xp.where(undetermined, xp.zeros_like(a), a)

    span = _any_weights_span(
        xp, dtype, undetermined, allowed, steps.grad_weights, rescale * products, value_dim
    ) + xp.where(undetermined, abs_lse_grad, xp.zeros_like(abs_lse_grad))
    loose = xp.astype(undetermined, xp.float64)
    loose_x = loose * (span * allowed + abs_dx)  # the kernel's |dX_ij| + the definition's

    alpha = abs(chunk.scale)
    abs_q, abs_k = xp.abs(chunk.q), xp.abs(chunk.k)
    # dq_i = alpha sum_j dX_ij k_j: D's error and the shift are common to the row, so they
    # move dq_i by alpha |sum_j kappa_ij p_ij k_j| G_i and gamma_i |dq_i|
    dq = xp.matmul(grad_x, chunk.k) * chunk.scale
    eps_q = first_order(
        alpha * xp.matmul(eps_x, abs_k)
        + alpha * xp.abs(xp.matmul(capped_weights, chunk.k)) * delta_error
        + gamma * xp.abs(dq)
        + (r_alpha + (counts.q + 2) * u_a) * alpha * xp.matmul(abs_dx, abs_k)
    ) + alpha * xp.matmul(loose_x, abs_k)

    def over_rows(left: Any, right: Any) -> Any:  # sum over the chunk's rows and the group
        return xp.sum(xp.matmul(xp.matrix_transpose(left), right), axis=-3)

    dbias = eps_b = None
    if bias_shape is not None:
        scores_shape = (*problem.out_shape[:-2], rows.stop - rows.start, n_keys)
        by_rows = len(bias_shape) >= 2 and bias_shape[-2] != 1
        target = (*bias_shape[:-2], rows.stop - rows.start, n_keys) if by_rows else bias_shape
        dbias = reduce_to_shape(xp, xp.reshape(steps.grad_scores, scores_shape), target)
        charged = first_order(eps_s_all + (counts.bias + 2) * u_a * abs_ds) + loose * (
            span * allowed + abs_ds
        )
        eps_b = reduce_to_shape(xp, xp.reshape(charged, scores_shape), target)
    return _Part(
        dq=dq,
        eps_q=eps_q,
        dk=over_rows(grad_x, chunk.q) * chunk.scale,
        eps_k=alpha * over_rows(first_order(eps_x_all) + loose_x, abs_q),
        abs_k=alpha * over_rows(first_order(abs_dx), abs_q),
        dv=over_rows(steps.kept, d_out),
        eps_v=over_rows(
            rescale * (first_order(key_error + weights * gamma) + loose * allowed), abs_d_out
        ),
        abs_v=over_rows(first_order(xp.abs(steps.kept)), abs_d_out),
        dbias=dbias,
        eps_b=eps_b,
    )


def _assembled(
    problem: GroupedInputs,
    parts: list[_Part],
    q: Array,
    k: Array,
    v: Array,
    bias: Array,
    dtype: str,
    counts: _Counts,
) -> GradientBound:
    """The chunks' terms put together: dq's rows joined, dk's, dv's (and a row-less bias
    gradient's) sums added, each reduced to its input's shape, and tau = C (eps + u_d |g|)
    + (N + 2) sigma_d (BWD-17)."""
    xp = problem.xp
    u_d, u_a = UNIT_ROUNDOFF[dtype], accumulation_roundoff(dtype)
    sigma = UNDERFLOW_THRESHOLD[dtype]
    r_alpha = scale_rounding(dtype)  # TOL-2's, at every scale (E-2026.12-14)

    def joined(arrays: list[Any]) -> Any:
        return arrays[0] if len(arrays) == 1 else xp.concat(arrays, axis=-2)

    def added(arrays: list[Any]) -> Any:
        total = arrays[0]
        for a in arrays[1:]:
            total = total + a
        return total

    def tolerance(eps: Any, gradient: Any, terms: int) -> Any:
        return SAFETY_FACTOR * (eps + u_d * xp.abs(gradient)) + (terms + 2) * sigma

    q_like = (*problem.out_shape[:-1], problem.q.shape[-1])
    dq = reduce_to_shape(xp, xp.reshape(joined([p.dq for p in parts]), q_like), tuple(q.shape))
    eps_q = reduce_to_shape(
        xp, xp.reshape(joined([p.eps_q for p in parts]), q_like), tuple(q.shape)
    )
    k_factor = r_alpha + (counts.k + 2) * u_a
    dk = reduce_to_shape(xp, added([p.dk for p in parts]), tuple(k.shape))
    eps_k = reduce_to_shape(
        xp,
        added([p.eps_k for p in parts]) + k_factor * added([p.abs_k for p in parts]),
        tuple(k.shape),
    )
    dv = reduce_to_shape(xp, added([p.dv for p in parts]), tuple(v.shape))
    eps_v = reduce_to_shape(
        xp,
        added([p.eps_v for p in parts]) + (counts.v + 3) * u_a * added([p.abs_v for p in parts]),
        tuple(v.shape),
    )
    dbias = dbias_tolerance = None
    if bias is not None:
        by_rows = bias.ndim >= 2 and bias.shape[-2] != 1
        combine = joined if by_rows else added
        dbias = combine([p.dbias for p in parts])
        dbias_tolerance = tolerance(combine([p.eps_b for p in parts]), dbias, counts.bias)
    return GradientBound(
        dq=dq,
        dk=dk,
        dv=dv,
        dbias=dbias,
        dq_tolerance=tolerance(eps_q, dq, counts.q),
        dk_tolerance=tolerance(eps_k, dk, counts.k),
        dv_tolerance=tolerance(eps_v, dv, counts.v),
        dbias_tolerance=dbias_tolerance,
    )


def _key_weight_error(problem: Any, dtype: str, weights: Any, allowed: Any) -> tuple[Any, Any]:
    """g^_ij: a weight's error from its own score (TOL-2's g_ij = p_ij (e^Delta'_ij - 1),
    Delta' with TOL-4's feature terms), its rounding to the dtype (u_d p_ij) and its underflow
    (sigma_d); 0 outside S(i), where every weight is exactly 0 (BWD-3).  Also returns g_ij
    alone (0 outside S(i))."""
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
    return xp.where(allowed, moved + u_d * weights + sigma, zero), moved


def _through_softcap(
    xp: ModuleType, problem: Any, dtype: str, abs_ds: Any, eps_s: Any, r_alpha: float
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
    x_error = (r_alpha + (head_dim + 5) * u_a) * magnitude
    factor_error = (
        2 * xp.abs(slope) * (factor * x_error / cap + tanh_roundoff(dtype) * xp.abs(slope))
        + 2 * u_a
    )
    abs_dx = factor * abs_ds
    return factor, factor * eps_s + factor_error * abs_ds + u_d * abs_dx, abs_dx


# BWD-17: a row whose weights' errors g_i = sum_j g_ij (TOL-2) reach 1/4 is beyond the
# first-order model: the products of two errors it drops are then no longer small beside the
# terms it keeps, and C = 4 allows them only a factor 2 (TOL-2)
LOOSE_WEIGHT_ERROR = 0.25


def _undetermined_rows(xp: ModuleType, moved: Any) -> Any:
    """Per row ``(..., rows, 1)``, True where g_i = sum_j g_ij >= LOOSE_WEIGHT_ERROR: the
    rows whose weights are undetermined to first order (BWD-17)."""
    return xp.sum(moved, axis=-1, keepdims=True) >= LOOSE_WEIGHT_ERROR


def _any_weights_span(
    xp: ModuleType,
    dtype: str,
    undetermined: Any,
    allowed: Any,
    grad_weights: Any,
    products: Any,
    value_dim: int,
) -> Any:
    """Per row ``(..., rows, 1)``, on undetermined rows, a bound on the kernel's
    |dP_ij - D_i| for any weights in [0, 1] over S(i): max_j |dP_ij| + sum_j |dP_ij| (D_i
    is a sum of dP_ij, each weighted at most 1) plus rho_i, its rounding of dP_ij and of D_i
    in either form (G_i's terms with every weight 1, |dP_ij| <= r_ij A^v_ij); 0 on every
    other row."""
    u_d, u_a = UNIT_ROUNDOFF[dtype], accumulation_roundoff(dtype)
    if not bool(xp.any(undetermined)):
        return xp.zeros_like(grad_weights[..., :1])
    abs_dp = xp.abs(grad_weights) * allowed
    largest = xp.max(abs_dp, axis=-1, keepdims=True)
    total = xp.sum(abs_dp, axis=-1, keepdims=True)
    n_keys = grad_weights.shape[-1]
    products_total = xp.sum(products * allowed, axis=-1, keepdims=True)
    rho = ((2 * value_dim + 2 * n_keys + 6) * u_a + 3 * u_d) * products_total
    return xp.where(undetermined, largest + total + rho, xp.zeros_like(rho))
