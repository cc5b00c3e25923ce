"""FlashAttention's comparative criterion for gradients (spec/backward.md, BWD-18).

:func:`same_dtype_attention_backward` is the comparison implementation of BWD-18: the
gradients that automatic differentiation of FlashAttention's test reference
``attention_ref(..., upcast=False, reorder_ops=True)`` gives in the input dtype (Dao-AILab/
flash-attention, ``tests/test_flash_attn.py`` and ``flash_attn/utils/testing.py``).  Every
operation of that forward pass and of its chain rule stores its result in the input dtype;
PyTorch evaluates each one in float32 for float16 and bfloat16 inputs (its "opmath": matrix
products and reductions accumulate in float32, ``softmax`` and its backward work in float32),
so here each step is computed in the working dtype of SDPA-7.2 and rounded to the input dtype
once.  The forward steps: ``k' = k * scale`` (the scaled key, ``reorder_ops``), ``S = q k'^T``,
the softcap ``c tanh(S / c)`` in three rounded steps, excluded pairs set to -inf, ``S + bias``
(ALiBi added in float32, as FlashAttention's float32 ``attn_bias`` promotes the scores),
``P = softmax(S)``, the dropout keep mask applied to ``P`` and ``v' = v / (1 - p)``, and
``O = P v'``.  The backward steps are those operations' derivatives in reverse, each rounded:
``dP = dO v'^T``, ``dv' = P^T dO``, ``dS = P (dP - D)`` with ``D = rowsum(P dP)`` (PyTorch's
softmax backward) or, in the comparison's second form, ``D = rowsum(dO O)`` from the stored
output (FlashAttention's backward, BWD-14), through the softcap ``dS c``, ``(1 - t^2)`` and
``/ c``, then ``dq = dX k'``,
``dk' = dX^T q``, ``dk = dk' * scale`` and ``dv = dv' / (1 - p)``, and the sums over a
group's query heads and the broadcast dimensions, each accumulated in the working dtype and
rounded once.

:func:`comparative_threshold` is BWD-18's threshold for a gradient of the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ._array import Array
from ._checks import namespace_of
from .backward import (
    BackwardOptions,
    Gradients,
    _check_upstream,
    backward_steps,
    reduce_to_shape,
)
from .features import check_dropout_p, dropped_weights, log_sum_exp
from .options import ScoreOptions, filled, shows_options
from .sdpa import allowed_scores, prepare_with_features, softmax_over_allowed
from .tolerance import UNDERFLOW_THRESHOLD, UNIT_ROUNDOFF

if TYPE_CHECKING:
    from typing import Unpack

CALL = "same_dtype_attention_backward(q, k, v, grad_out)"
LARGEST_CALL = "largest_score(q, k)"
THRESHOLD_CALL = "comparative_threshold(reference_error, floor)"
FLOOR_CALL = "comparative_floors(q, k, v, grad_out, dtype=...)"
# BWD-18's factor: FlashAttention 2's test_flash_attn_output allows its kernels 3 times the
# largest error of the same-dtype implementation, with and without dropout (the 3x rule)
FACTOR = 3.0
# BWD-18's scope: scores float32 resolves to within a quarter (u_a |s| < 1/4), as BWD-17's
# determined rows; beyond it a row's weights are undetermined in float32 arithmetic
SCORE_LIMIT = 0.25 / UNIT_ROUNDOFF["float32"]


@shows_options(BackwardOptions)
def same_dtype_attention_backward(
    q: Array,
    k: Array,
    v: Array,
    grad_out: Array,
    *,
    store: Callable[[Array], Array] | None = None,
    delta_from_output: bool = False,
    **given: Unpack[BackwardOptions],
) -> Gradients:
    """The gradients of BWD-18's comparison implementation: automatic differentiation of
    FlashAttention's ``attention_ref(..., upcast=False, reorder_ops=True)`` in the dtype of
    ``q``, every step computed in the working dtype (float32 for float16 and bfloat16) and
    rounded to the input dtype (the module's docstring lists the steps).

    Arguments are those of ``scaled_dot_product_attention_backward`` except ``grad_lse``
    (FlashAttention's reference returns no log-sum-exp); ``grad_out`` is rounded to the input
    dtype first.  Rows with no allowed key get zero gradients (BWD-4), as FlashAttention's
    reference fills them.  ``store``: how a step's result is stored, for inputs given in float32
    holding the values of a dtype their namespace lacks (NumPy's bfloat16); default: in the
    inputs' own dtype.  ``delta_from_output``: the second form, the delta term
    ``D = rowsum(dO O)`` from the stored output ``O`` as FlashAttention's backward forms it,
    rather than autograd's ``rowsum(P dP)`` (BWD-18 takes the larger error of the two).
    Returns :class:`~.backward.Gradients` in the inputs' dtypes.
    """
    options = filled(BackwardOptions, given)
    if options["grad_lse"] is not None:
        raise ValueError(
            "grad_lse was given, but FlashAttention's reference returns no log-sum-exp, so "
            f"the comparison implementation takes none [BWD-18, {CALL}]"
        )
    dropout_p = check_dropout_p(options["dropout_p"], CALL)
    keep = options["dropout_keep"]
    if keep is None and dropout_p != 0.0:
        raise ValueError(
            f"dropout_p={dropout_p} without dropout_keep, but the comparison implementation "
            f"needs the forward's keep indicators [BWD-9, BWD-18, {CALL}]"
        )
    problem = prepare_with_features(q, k, v, options, CALL)
    xp, work = problem.xp, problem.q.dtype
    _check_upstream(xp, "grad_out", grad_out, problem.out_shape, CALL)

    def stored(a: Any) -> Any:  # one operation's result, stored in the input dtype
        return xp.astype(xp.astype(a, q.dtype), work) if store is None else store(a)

    scale, cap, grouped_q = problem.scale, problem.softcap, problem.q
    d_out = stored(
        xp.reshape(xp.astype(grad_out, work), (*grouped_q.shape[:-1], grad_out.shape[-1]))
    )
    scaled_k = stored(problem.k * scale)
    scores = stored(xp.matmul(grouped_q, xp.matrix_transpose(scaled_k)))
    capped = None
    if cap is not None:
        capped = stored(xp.tanh(stored(scores / cap)))
        scores = stored(capped * cap)
    if problem.bias is not None:
        scores = stored(scores + problem.bias)
    if problem.alibi is not None:
        scores = scores + problem.alibi  # float32, as attention_ref's float32 attn_bias
    allowed = scores != -xp.inf
    if problem.allowed is not None:
        allowed = xp.logical_and(allowed, problem.allowed)
    scores = xp.where(allowed, scores, xp.full_like(scores, -xp.inf))
    weights = stored(softmax_over_allowed(xp, scores, allowed))
    kept, scaled_v, keep_grouped = weights, problem.v, None
    if keep is not None:  # the forward's keep indicators, in the grouped layout (BWD-9)
        ones = xp.ones_like(weights)
        keep_grouped = dropped_weights(problem, ones, dropout_p, keep, CALL) != 0
        kept = xp.where(keep_grouped, weights, xp.zeros_like(weights))
        scaled_v = stored(problem.v * (1.0 / (1.0 - dropout_p)))

    grad_weights = stored(xp.matmul(d_out, xp.matrix_transpose(scaled_v)))
    grad_v = stored(xp.matmul(xp.matrix_transpose(kept), d_out))
    if keep_grouped is not None:
        grad_weights = xp.where(keep_grouped, grad_weights, xp.zeros_like(grad_weights))
        grad_v = stored(grad_v * (1.0 / (1.0 - dropout_p)))
    if delta_from_output:  # O = P v' stored, as attention_ref returns it; D in float32
        delta = xp.sum(d_out * stored(xp.matmul(kept, scaled_v)), axis=-1, keepdims=True)
    else:
        delta = xp.sum(weights * grad_weights, axis=-1, keepdims=True)
    grad_x = stored(weights * (grad_weights - delta))
    grad_scores = grad_x
    if cap is not None and capped is not None:
        grad_x = stored(stored(stored(grad_x * cap) * (1 - capped * capped)) / cap)
    grad_q = stored(xp.matmul(grad_x, scaled_k))
    grad_k = stored(stored(xp.matmul(xp.matrix_transpose(grad_x), grouped_q)) * scale)

    batch = problem.out_shape[:-3]
    n_q_heads, n_queries = problem.out_shape[-3], problem.out_shape[-2]

    def summed(a: Any, head_axis: bool, like: Array) -> Any:
        """Summed over the group's query heads (``head_axis``) and the broadcast dims in
        the working dtype, stored once in ``like``'s dtype (BWD-2)."""
        if head_axis:
            a = xp.sum(a, axis=-3)
        else:
            a = xp.reshape(a, (*batch, n_q_heads, n_queries, a.shape[-1]))
        return xp.astype(stored(reduce_to_shape(xp, a, tuple(like.shape))), like.dtype)

    bias = options["bias"]
    dbias = None
    if bias is not None:
        full = xp.reshape(grad_scores, (*batch, n_q_heads, n_queries, scores.shape[-1]))
        dbias = xp.astype(stored(reduce_to_shape(xp, full, tuple(bias.shape))), bias.dtype)
    return Gradients(
        summed(grad_q, False, q), summed(grad_k, True, k), summed(grad_v, True, v), dbias
    )


@shows_options(ScoreOptions)
def largest_score(q: Array, k: Array, **given: Unpack[ScoreOptions]) -> float:
    """BWD-18's bound on every allowed score's magnitude, ``max|b| + max|a| + min(c, |scale|
    max_i |q_i| max_j |k_j|)`` (finite bias entries ``b``, ALiBi bias ``a``, softcap ``c``):
    BWD-18 applies where it is below :data:`SCORE_LIMIT`."""
    options = filled(ScoreOptions, given)
    xp = namespace_of(LARGEST_CALL, q=q, k=k)
    wide = xp.float64 if q.dtype == xp.float64 else xp.float32

    def largest(a: Any) -> float:
        a = xp.abs(xp.astype(a, wide))
        return float(xp.max(a)) if math.prod(a.shape) else 0.0

    def longest(a: Any) -> float:
        a = xp.astype(a, wide)
        return math.sqrt(largest(xp.sum(a * a, axis=-1))) if math.prod(a.shape) else 0.0

    scale = options["scale"]
    alpha = 1.0 / math.sqrt(q.shape[-1]) if scale is None else abs(scale)
    products = alpha * longest(q) * longest(k)
    if options["softcap"] is not None:
        products = min(products, float(options["softcap"]))
    bias, slopes = options["bias"], options["alibi_slopes"]
    total = products
    if bias is not None:
        finite = xp.where(xp.isfinite(bias), bias, xp.zeros_like(bias))
        total += largest(finite)
    if slopes is not None:  # |i + d - j| is below the longer length
        total += largest(slopes) * max(q.shape[-2], k.shape[-2])
    return total


class GradientFloats(NamedTuple):
    """One number per gradient (``dbias`` None without a bias)."""

    dq: float
    dk: float
    dv: float
    dbias: float | None = None


@shows_options(BackwardOptions)
def comparative_floors(
    q: Array, k: Array, v: Array, grad_out: Array, *, dtype: str, **given: Unpack[BackwardOptions]
) -> GradientFloats:
    """BWD-18's floor of each gradient for inputs of ``dtype`` (float64 values, BWD-16):
    ``2 (u_a max r^Y + sigma_d)``, ``u_a`` float32's unit roundoff, where ``r^Y`` is, per
    element of ``dY``, the root-sum-square of its terms taken in magnitude, each times
    ``e_ij = E_v + 2 + |s_ij| + |lse_i|`` (dP and D summed from E_v products and subtracted;
    the weight recomputed in float32 from the score and the row's log-sum-exp, each rounded
    at its magnitude): ``scale k_j kappa_ij p_ij m_ij`` of ``dq_i``, ``scale q_i kappa_ij
    p_ij m_ij`` of ``dk_j``, ``W_ij dO_i`` of ``dv_j`` and ``p_ij m_ij`` of ``db``, with
    ``m_ij = sum_c |dO_ic| |v_jc| (xi_ij / (1 - p)) + sum_c |dO_ic| |o_ic| + |dlse_i|`` the
    magnitudes dP and D are summed from, over the same rows, keys, groups and broadcast
    dimensions as the gradient."""
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(
            f"dtype={dtype!r}, but should be one of {', '.join(UNIT_ROUNDOFF)} "
            f"[BWD-18, {FLOOR_CALL}]"
        )
    options = filled(BackwardOptions, given)
    dropout_p = check_dropout_p(options["dropout_p"], FLOOR_CALL)
    problem = prepare_with_features(q, k, v, options, FLOOR_CALL)
    xp = problem.xp
    if problem.q.dtype != xp.float64:
        raise TypeError(
            f"q.dtype={q.dtype}, but should be float64 holding values of {dtype} "
            f"[BWD-16, {FLOOR_CALL}]"
        )
    _check_upstream(xp, "grad_out", grad_out, problem.out_shape, FLOOR_CALL)
    d_out = xp.reshape(xp.astype(grad_out, xp.float64), (*problem.q.shape[:-1], grad_out.shape[-1]))
    grad_lse = options["grad_lse"]
    d_lse = None
    if grad_lse is not None:
        d_lse = xp.reshape(xp.astype(grad_lse, xp.float64), (*problem.q.shape[:-1], 1))
    steps = backward_steps(problem, d_out, d_lse, dropout_p, options["dropout_keep"], FLOOR_CALL)
    # the magnitudes dP and D are summed from: sum_c |dO_ic| |v_jc| and sum_c |dO_ic| |o_ic|
    abs_out = xp.abs(d_out)
    magnitudes = xp.matmul(abs_out, xp.matrix_transpose(xp.abs(problem.v)))
    if steps.rescale is not None:
        magnitudes = magnitudes * steps.rescale
    out = xp.matmul(steps.kept, problem.v)
    uncancelled = magnitudes + xp.sum(abs_out * xp.abs(out), axis=-1, keepdims=True)
    if d_lse is not None:
        uncancelled = uncancelled + xp.abs(d_lse)
    # float32's relative error of each term, over u_a: dP and D summed from E_v products and
    # subtracted, and the weight exp(s - lse) from a score and a log-sum-exp rounded at their
    # magnitudes (FlashAttention 2 recomputes it so)
    scores, allowed = allowed_scores(problem)
    lse = log_sum_exp(xp, scores, allowed)[..., None]
    roundings = (
        problem.v.shape[-1]
        + 2
        + xp.abs(xp.where(allowed, scores, xp.zeros_like(scores)))
        + xp.abs(xp.where(xp.isfinite(lse), lse, xp.zeros_like(lse)))
    )
    terms = xp.where(allowed, steps.weights * uncancelled * roundings, xp.zeros_like(roundings))
    grad_terms = terms
    if problem.softcap is not None:
        x = xp.matmul(problem.q, xp.matrix_transpose(problem.k)) * problem.scale
        slope = xp.tanh(x / problem.softcap)
        grad_terms = terms * (1 - slope * slope)
    squares = grad_terms * grad_terms
    alpha = abs(problem.scale)
    batch = problem.out_shape[:-3]
    n_q_heads, n_queries = problem.out_shape[-3], problem.out_shape[-2]

    def largest_root(sum_of_squares: Any, like: Array) -> float:
        """The largest root of the sums of squares, summed over ``like``'s broadcast dims."""
        summed = reduce_to_shape(xp, sum_of_squares, tuple(like.shape))
        return math.sqrt(float(xp.max(summed))) if math.prod(summed.shape) else 0.0

    bias = options["bias"]
    rows = (*batch, n_q_heads, n_queries, q.shape[-1])
    q_roots = xp.reshape(xp.matmul(squares, problem.k * problem.k), rows)
    k_roots = xp.sum(xp.matmul(xp.matrix_transpose(squares), problem.q * problem.q), axis=-3)
    kept = steps.kept * roundings
    v_roots = xp.sum(xp.matmul(xp.matrix_transpose(kept * kept), d_out * d_out), axis=-3)
    roots = [
        alpha * largest_root(q_roots, q),
        alpha * largest_root(k_roots, k),
        largest_root(v_roots, v),
    ]
    if bias is not None:
        full = xp.reshape(terms * terms, (*batch, n_q_heads, n_queries, problem.k.shape[-2]))
        roots.append(largest_root(full, bias))
    u_a, sigma_d = UNIT_ROUNDOFF["float32"], UNDERFLOW_THRESHOLD[dtype]
    return GradientFloats(*(2.0 * (u_a * root + sigma_d) for root in roots))


def last_place(largest: float, dtype: str) -> float:
    """One unit in the last place of ``dtype`` at ``largest`` (a gradient's largest
    magnitude): the spacing of the dtype's values there, ``sigma_d`` below it (BWD-18's
    floor: a gradient stored in the dtype)."""
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(
            f"dtype={dtype!r}, but should be one of {', '.join(UNIT_ROUNDOFF)} "
            f"[BWD-18, last_place(largest, dtype)]"
        )
    sigma_d = UNDERFLOW_THRESHOLD[dtype]
    if not (math.isfinite(largest) and largest > 0):
        return sigma_d
    exponent = math.frexp(largest)[1] - 1  # 2**exponent <= largest < 2**(exponent + 1)
    return max(math.ldexp(2.0 * UNIT_ROUNDOFF[dtype], exponent), sigma_d)


def comparative_threshold(reference_error: float, floor: float) -> float:
    """BWD-18's threshold for a gradient's largest absolute error: ``max(3 * reference_error,
    floor)`` (:func:`comparative_floors`), where ``reference_error`` is the comparison
    implementation's largest absolute error."""
    if not reference_error >= 0:
        raise ValueError(
            f"reference_error={reference_error!r}, but should be a largest absolute error, "
            f">= 0 [BWD-18, {THRESHOLD_CALL}]"
        )
    return max(FACTOR * reference_error, floor)
