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
from typing import TYPE_CHECKING, Any, NamedTuple

import array_api_compat

from ._array import Array
from .options import CHUNK_ELEMENTS as CHUNK_ELEMENTS  # re-exported: the bounds' users
from .options import ScoreOptions, filled, shows_options
from .sdpa import (
    GroupedInputs,
    allowed_and_capped_scores,
    nonfinite_counts,
    plain_attention,
    prepare_with_features,
    with_nonfinite_values,
)

if TYPE_CHECKING:
    from typing import Unpack

UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}
# sigma_d of TOL-2: the dtype's smallest subnormal, or the smallest normal of the format the
# kernel computes in when that is larger, so flush-to-zero arithmetic (GPUs, XLA on CPU) conforms
UNDERFLOW_THRESHOLD = {
    "float16": 2.0**-24,
    "bfloat16": 2.0**-126,
    "float32": 2.0**-126,
    "float64": 2.0**-1022,
}
SAFETY_FACTOR = 4.0  # TOL-2: 2 for second-order terms, times 2 for the oracle's own error
# Score-error terms beyond this can only reach the hull cap of TOL-2, so larger values need
# not be represented (and exp never overflows).
_SATURATED_WEIGHT_ERROR = 2.0


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


class LseBound(NamedTuple):
    """The log-sum-exp of LSE-1 in float64, ``(..., Hq, Lq)`` (-inf for rows without a
    key), and its allowed error (TOL-5; 0 where the log-sum-exp is -inf)."""

    lse: Any
    lse_tolerance: Any


def accumulation_roundoff(dtype: str) -> float:
    """u_a of TOL-2: float32's for half precision inputs (SDPA-7.2), else the dtype's."""
    return min(UNIT_ROUNDOFF[dtype], UNIT_ROUNDOFF["float32"])


def product_coefficient(dtype: str, head_dim: int, scale: float | None = None) -> float:
    """TOL-2's coefficient of |alpha| A_ij in the score error Delta_ij: r_alpha + (E + 4)u_a,
    r_alpha = 4u_d for every scale (a kernel may round its scale factor and the operands it
    scales to the input dtype, E-2026.12-14), so the bound of the same scaled scores is the
    same at every head dim; ``scale`` is kept for callers that pass it."""
    del scale  # r_alpha no longer depends on it
    return scale_rounding(dtype) + (head_dim + 4) * accumulation_roundoff(dtype)


def scale_rounding(dtype: str) -> float:
    """r_alpha of TOL-2: 4u_d, the scale and the scaled operands rounded to the dtype."""
    return 4 * UNIT_ROUNDOFF[dtype]


def scale_is_exact(alpha: float) -> bool:
    """True when sqrt(|alpha|) is a power of two (or alpha is 0): then alpha and sqrt(alpha)
    are exact in every dtype and multiplying an operand by either is exact (TOL-2)."""
    root = math.sqrt(abs(alpha))
    return alpha == 0 or (root * root == abs(alpha) and math.frexp(root)[0] == 0.5)


def tanh_roundoff(dtype: str) -> float:
    """u_t of TOL-4: the relative error allowed to the softcap's tanh.  2u_d for half
    precision (a hardware approximate tanh, as FlashAttention uses, is within it), two
    units in the last place of the accumulation format (4u_a) otherwise, as for exp."""
    if UNIT_ROUNDOFF[dtype] > UNIT_ROUNDOFF["float32"]:
        return 2 * UNIT_ROUNDOFF[dtype]
    return 4 * accumulation_roundoff(dtype)


def feature_score_error(
    xp: ModuleType,
    dtype: str,
    magnitude: Any,
    capped: Any,
    bias: Array,
    alibi: Any,
) -> Any:
    """What softcapping and ALiBi add to TOL-2's score error Delta_ij (TOL-4).

    ``magnitude`` is |alpha| A_ij; ``capped`` the capped scores c tanh(x / c) (None
    without softcap); ``bias`` and ``alibi`` the user bias and the ALiBi bias (or None).
    Softcap: u_a |alpha| A_ij (dividing by the cap) + (u_t + u_a)|c_ij| (the tanh and the
    multiplication by the cap).  ALiBi: u_a (|alpha| A_ij + |b_ij|) (the second addition
    into the score) + 5 u_a |a_ij| (slope times distance, the slope divided by the scale
    and multiplied back, the log2(e) folding, the addition).
    """
    u_a = accumulation_roundoff(dtype)
    extra = xp.zeros_like(magnitude)
    if capped is not None:
        extra = extra + u_a * magnitude + (tanh_roundoff(dtype) + u_a) * xp.abs(capped)
    if alibi is not None:
        extra = extra + u_a * magnitude + 5 * u_a * xp.abs(alibi)
        if bias is not None:
            extra = extra + u_a * xp.abs(bias)
    return extra


def lse_final_error(dtype: str, n_keys: int, row_max: Array, xp: ModuleType) -> Any:
    """The part of TOL-5 outside the scores: the row sum ((L_k - 1) u_a), the logarithm,
    the scale applied to the maximum, the addition, a ln 2 conversion and the store
    (4 u_a |m_i| + 5 u_a log L_k)."""
    u_a = accumulation_roundoff(dtype)
    return max(n_keys - 1, 0) * u_a + 5 * u_a * math.log(max(n_keys, 1)) + 4 * u_a * xp.abs(row_max)


class ScoreErrorOptions(ScoreOptions, total=False):
    """The keywords of :func:`score_errors` beside ``dtype``."""

    chunk_elements: int


class BoundOptions(ScoreErrorOptions, total=False):
    """The keywords of the forward's bounds (TOL-2, TOL-5) beside ``dtype``."""

    weights: bool


@shows_options(BoundOptions)
def error_bound(
    q: Array, k: Array, v: Array, *, dtype: str, **given: Unpack[BoundOptions]
) -> ErrorBound:
    """TOL-2 for inputs given in float64 holding values exactly representable in ``dtype``.

    Shapes follow SDPA-1.1; ``out``/``out_tolerance`` are ``(..., Hq, Lq, Ev)`` and
    ``weights``/``weights_tolerance`` are ``(..., Hq, Lq, Lk)``.  Where the definition
    is not finite the tolerance is 0: the kernel must match it exactly (TOL-3).
    ``weights=False`` skips the weights (for large problems); ``softcap`` and
    ``alibi_slopes`` are the features of spec/features.md, whose score errors TOL-4 adds.
    ``chunk_elements`` bounds the size of the (rows x keys) blocks evaluated at once, and
    so the memory used.
    """
    return _bounds(q, k, v, dtype, filled(BoundOptions, given), lse=False)[0]


@shows_options(BoundOptions)
def error_and_lse_bound(
    q: Array, k: Array, v: Array, *, dtype: str, **given: Unpack[BoundOptions]
) -> tuple[ErrorBound, LseBound]:
    """:func:`error_bound` and the log-sum-exp with its TOL-5 bound, in one pass."""
    bound, lse_bound = _bounds(q, k, v, dtype, filled(BoundOptions, given), lse=True)
    assert lse_bound is not None  # _bounds(..., lse=True, ...) computes it
    return bound, lse_bound


@shows_options(ScoreErrorOptions)
def score_errors(
    q: Array, k: Array, v: Array, *, dtype: str, **given: Unpack[ScoreErrorOptions]
) -> Array:
    """D_i of TOL-2 per query row, ``(..., Hq, Lq)``: :func:`error_bound`'s ``score_error``
    to the bit (the same evaluation, stopped before the sums over the values, which D_i
    does not use: two of its five matrix products)."""
    options = filled(BoundOptions, {**given, "weights": False})
    return _bounds(q, k, v, dtype, options, lse=False, score_only=True)[0].score_error


def _bounds(
    q: Array,
    k: Array,
    v: Array,
    dtype: str,
    options: BoundOptions,
    *,
    lse: bool,
    score_only: bool = False,
) -> tuple[ErrorBound, LseBound | None]:
    """Both bounds over row chunks, for the keywords ``options`` (each present); with
    ``score_only``, only the ErrorBound's ``score_error`` (the other fields None)."""
    weights, chunk_elements = options["weights"], options["chunk_elements"]
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype={dtype!r}, but should be one of {tuple(UNIT_ROUNDOFF)}")
    if (
        isinstance(chunk_elements, bool)
        or not isinstance(chunk_elements, int)
        or chunk_elements < 1
    ):
        raise ValueError(f"chunk_elements={chunk_elements!r}, but should be a positive int")
    problem = prepare_with_features(q, k, v, options, "error_bound(q, k, v)")
    xp = problem.xp
    if problem.q.dtype != xp.float64:
        raise TypeError(f"error_bound needs float64 inputs, got {problem.q.dtype}")
    *grouped, n_queries, _ = problem.q.shape
    n_keys = problem.k.shape[-2]
    rows_per_chunk = max(1, chunk_elements // max(1, math.prod(grouped) * n_keys))
    starts = range(0, n_queries, rows_per_chunk) if n_queries else [0]
    values = ValueColumns(None, None, None) if score_only else _value_columns(problem)
    parts = [
        _chunk_bound(
            problem,
            values,
            start,
            min(start + rows_per_chunk, n_queries),
            dtype,
            weights,
            lse,
            score_only,
        )
        for start in starts
    ]
    out_shape, weights_shape = problem.out_shape, (*problem.out_shape[:-1], n_keys)
    rows_shape = out_shape[:-1]
    shapes = (
        out_shape,
        out_shape,
        weights_shape,
        weights_shape,
        rows_shape,
        rows_shape,
        rows_shape,
        rows_shape,
    )
    whole = [
        None
        if pieces[0] is None
        else xp.reshape(xp.concat(list(pieces), axis=-2) if len(parts) > 1 else pieces[0], shape)
        for pieces, shape in zip(zip(*parts, strict=True), shapes, strict=True)
    ]
    return ErrorBound(*whole[:6]), (LseBound(*whole[6:]) if lse else None)


class ValueColumns(NamedTuple):
    """What TOL-2 needs of the values, computed once for all row chunks: ``table`` is
    ``(..., Lk, 3 Ev)``, [v, |v|, v*v] with non-finite values as 0 (one matrix product
    per left factor gives every sum over keys at once), or None when V is the identity
    (the weights observed as outputs: each such sum is then the left factor itself);
    ``low``/``high`` the values' hull (finite values of each key/value head, over all its
    keys); ``finite`` True when every value is finite (no chunk then needs SDPA-8.3)."""

    table: Any
    low: Any
    high: Any
    finite: bool = False


def _value_columns(problem: GroupedInputs) -> ValueColumns:
    xp, v = problem.xp, problem.v
    if _is_identity(xp, v):  # its table would be Lk x 3Lk, and its products O(Lq Lk^2)
        n_keys = v.shape[-2]
        high = xp.ones((*v.shape[:-2], 1, n_keys), dtype=v.dtype, device=array_api_compat.device(v))
        return ValueColumns(None, high if n_keys == 1 else xp.zeros_like(high), high, True)
    # V is finite but where a property puts non-finite values at masked keys: one pass to
    # find out, instead of a zero-filled copy of every V (issue 33)
    all_finite = bool(xp.all(xp.isfinite(v)))
    finite = v if all_finite else xp.where(xp.isfinite(v), v, xp.zeros_like(v))
    table = xp.concat([finite, xp.abs(finite), finite * finite], axis=-1)
    if v.shape[-2] == 0:
        return ValueColumns(table, None, None, all_finite)
    return ValueColumns(
        table,
        xp.min(finite, axis=-2, keepdims=True),
        xp.max(finite, axis=-2, keepdims=True),
        all_finite,
    )


def _is_identity(xp: ModuleType, v: Array) -> bool:
    """Whether every key/value head of ``v`` is the Lk x Lk identity."""
    n_keys = v.shape[-2]
    if n_keys == 0 or v.shape[-1] != n_keys:
        return False
    eye = xp.eye(n_keys, dtype=v.dtype, device=array_api_compat.device(v))
    return bool(xp.all(v == eye))


def _sums_over_keys(
    xp: ModuleType, left: Any, table: Any, width: int, first: int, count: int, keys: slice
) -> tuple[Any, ...]:
    """``left`` (its columns: the keys ``keys``) times ``count`` column blocks of ``width``
    of ``table`` (its rows: the same keys), from block ``first`` (0: v, 1: |v|, 2: v*v).
    A ``table`` of None stands for V = I (:class:`ValueColumns`): every block is then
    ``left`` in the columns of its keys and 0 elsewhere, as the product gives it (sums of
    x_ij times one 1 and 0s: exact), unless ``left`` has a non-finite x_ij, which times
    the 0s of I makes NaNs that only the product itself places."""
    if table is None:
        device = array_api_compat.device(left)
        if bool(xp.all(xp.isfinite(left))):
            shape = left.shape[:-1]
            before = xp.zeros((*shape, keys.start), dtype=left.dtype, device=device)
            after = xp.zeros((*shape, width - keys.stop), dtype=left.dtype, device=device)
            placed = xp.concat([before, left, after], axis=-1)
        else:
            identity = xp.eye(width, dtype=left.dtype, device=device)
            placed = xp.matmul(left, identity[keys.start : keys.stop, :])
        return (placed,) * count
    product = xp.matmul(left, table[..., first * width : (first + count) * width])
    return _split(product, width, count)


def _rows(a: Any, start: int, stop: int) -> Any:
    """Query rows ``start:stop`` of an array that is (or broadcasts) ``(..., Lq, ·)``."""
    return a if a is None or a.shape[-2] == 1 else a[..., start:stop, :]


def _exp_without_overflow(xp: ModuleType, x: Array) -> Array:
    """``exp(x)``, inf where it overflows, without the library's overflow warning: a row
    whose largest score is +inf or NaN (SDPA-8) makes the shifted scores of its finite keys
    huge, and ``exp`` of them is inf either way."""
    overflows = x > math.log(xp.finfo(x.dtype).max)
    if not bool(xp.any(overflows)):  # the usual case: exp(x) itself, to the bit
        return xp.exp(x)
    return xp.where(
        overflows, xp.full_like(x, xp.inf), xp.exp(xp.where(overflows, xp.zeros_like(x), x))
    )


def _chunk_bound(
    problem: GroupedInputs,
    values: ValueColumns,
    start: int,
    stop: int,
    dtype: str,
    with_weights: bool,
    with_lse: bool = False,
    score_only: bool = False,
) -> tuple[Any, ...]:
    """(out, tau, p, tau^p, D, attends, lse, tau^lse) of TOL-2 and TOL-5 for query rows
    ``start:stop``, grouped layout; p and tau^p are None unless ``with_weights``, lse and
    tau^lse unless ``with_lse``; all but D None with ``score_only``."""
    xp = problem.xp
    chunk = problem._replace(
        q=problem.q[..., start:stop, :],
        allowed=_rows(problem.allowed, start, stop),
        bias=_rows(problem.bias, start, stop),
        alibi=_rows(problem.alibi, start, stop),
    )
    u_d, u_a = UNIT_ROUNDOFF[dtype], accumulation_roundoff(dtype)
    # Lk of the formulas is the problem's; the keys evaluated may be fewer: without the
    # weights, keys no row of the chunk may attend add exactly 0 to every sum of TOL-2, so
    # they are left out (a causal chunk skips the key blocks past its last row).
    n_keys, head_dim = chunk.k.shape[-2], chunk.q.shape[-1]
    value_dim = chunk.v.shape[-1]
    table, keys = values.table, slice(0, n_keys)
    if not with_weights:
        chunk, keys = _attended_keys(chunk)
        table = None if table is None else table[..., keys, :]
    scores, allowed, capped = allowed_and_capped_scores(chunk)
    zero = xp.zeros_like(scores)
    row_max = xp.max(scores, axis=-1, keepdims=True) if n_keys else scores[..., :1]
    row_max = xp.where(xp.isfinite(row_max), row_max, xp.zeros_like(row_max))
    gap = xp.where(allowed, row_max - scores, zero)  # >= 0: the shifted score's size
    exps = xp.where(allowed, _exp_without_overflow(xp, -gap), zero)
    total = xp.sum(exps, axis=-1, keepdims=True)
    total = xp.where(total == 0, xp.ones_like(total), total)
    weights = exps / total

    # Delta_ij: the largest error of the computed shifted score of an allowed key.
    magnitude = xp.matmul(xp.abs(chunk.q), xp.matrix_transpose(xp.abs(chunk.k)))
    delta = (
        product_coefficient(dtype, head_dim, chunk.scale) * abs(chunk.scale) * magnitude
        + 3 * u_a * gap
        + 6 * u_a
    )
    if chunk.bias is not None:
        delta = delta + 2 * u_a * xp.abs(chunk.bias)
    if chunk.softcap is not None or chunk.alibi is not None:
        # the capped scores the scores were made from (the same product, scaled and capped)
        delta = delta + feature_score_error(
            xp, dtype, abs(chunk.scale) * magnitude, capped, chunk.bias, chunk.alibi
        )
    delta = xp.where(allowed, delta, zero)
    small_delta = bool(xp.all(delta < 1))
    # log p_ij, needed only where a Delta_ij is large or for the log-sum-exp
    log_weights = (
        None
        if small_delta and not with_lse
        else xp.where(allowed, -gap - xp.log(total), xp.full_like(scores, -xp.inf))
    )
    lse, lse_tolerance = (
        _lse_bound(xp, dtype, row_max, total, log_weights, delta, allowed, n_keys)
        if with_lse
        else (None, None)
    )
    # g_ij = p_ij (e^Delta_ij - 1) of TOL-2; below 1, p_ij (e - 1) < 2 and 0 outside S(i)
    moved = (
        weights * xp.expm1(delta)
        if small_delta
        else _moved_weights_saturated(xp, weights, log_weights, delta, allowed)
    )
    score_error = xp.sum(moved, axis=-1, keepdims=True)  # D_i
    if score_only:
        return None, None, None, None, score_error, None, None, None
    determined = score_error < 1
    amplification = 1 / xp.where(determined, 1 - score_error, xp.ones_like(score_error))

    # one wide matrix product per left factor gives its sums with v, |v| (and v*v)
    out, weighted_abs = _sums_over_keys(xp, weights, table, value_dim, 0, 2, keys)  # o_ic, M_ic
    # SDPA-8.3, as the definition evaluates it
    if not values.finite and not bool(xp.all(xp.isfinite(chunk.v))):
        out = with_nonfinite_values(xp, out, nonfinite_counts(xp, allowed, chunk.v))
    finite = xp.isfinite(out)
    all_finite = bool(xp.all(finite))
    finite_out = out if all_finite else xp.where(finite, out, xp.zeros_like(out))
    abs_out = xp.abs(finite_out)
    moved_v, moved_abs, moved_v2 = _sums_over_keys(xp, moved, table, value_dim, 0, 3, keys)
    # sum_j g_ij |v_jc - o_ic| <= min(triangle inequality, Cauchy-Schwarz)
    by_triangle = moved_abs + score_error * abs_out
    moved_square = score_error * finite_out * finite_out
    quadratic = moved_v2 - 2 * finite_out * moved_v + moved_square
    quadratic_rounding = (
        4 * UNIT_ROUNDOFF["float64"] * (moved_v2 + 2 * abs_out * moved_abs + moved_square)
    )
    by_cauchy_schwarz = xp.sqrt(
        score_error * (xp.maximum(quadratic, xp.zeros_like(quadratic)) + quadratic_rounding)
    )
    spread = xp.minimum(by_triangle, by_cauchy_schwarz)
    renormalised = (
        spread * amplification
        if bool(xp.all(determined))
        else xp.where(determined, spread * amplification, xp.full_like(spread, xp.inf))
    )
    hull = (
        xp.zeros_like(finite_out)
        if values.low is None
        else xp.maximum(values.high - finite_out, finite_out - values.low)
    )
    # the cap: a renormalising kernel's output lies in the hull; one that does not scales
    # such a combination by its weights' sum, within D_i of 1 where D_i < 1
    determined_error = xp.where(determined, score_error, xp.zeros_like(score_error))
    score_part = xp.minimum(renormalised + moved_abs, 2 * hull + determined_error * abs_out)

    sigma = UNDERFLOW_THRESHOLD[dtype]
    floor = (n_keys + 2) * sigma
    (allowed_abs_values,) = _sums_over_keys(
        xp, xp.astype(allowed, weights.dtype), table, value_dim, 1, 1, keys
    )
    out_tolerance = (
        SAFETY_FACTOR * (score_part + (u_d + (n_keys + 2) * u_a) * weighted_abs + u_d * abs_out)
        + floor
        + sigma * allowed_abs_values
    )
    if not all_finite:
        out_tolerance = xp.where(finite, out_tolerance, xp.zeros_like(out))
    attends = xp.any(allowed, axis=-1, keepdims=True)
    if not with_weights:
        return out, out_tolerance, None, None, score_error, attends, lse, lse_tolerance
    weight_change = xp.where(
        determined, (moved + weights * score_error) * amplification, xp.ones_like(moved)
    )
    weights_tolerance = (
        SAFETY_FACTOR * (xp.minimum(weight_change, xp.ones_like(moved)) + u_d * weights) + floor
    )
    return (
        out,
        out_tolerance,
        weights,
        weights_tolerance,
        score_error,
        attends,
        lse,
        lse_tolerance,
    )


def _attended_keys(chunk: GroupedInputs) -> tuple[GroupedInputs, slice]:
    """``chunk`` cut to the keys [lo, hi) that the mask and causal rule let some row of it
    attend (at least one key, so shapes stay non-empty), and that slice of the keys."""
    xp, allowed = chunk.xp, chunk.allowed
    n_keys = chunk.k.shape[-2]
    if allowed is None or n_keys == 0:
        return chunk, slice(0, n_keys)
    columns = xp.any(allowed, axis=tuple(range(allowed.ndim - 1)))
    attended = xp.nonzero(columns)[0]
    if attended.shape[0] == 0:
        low, high = 0, 1
    else:
        low, high = int(attended[0]), int(attended[-1]) + 1
    if (low, high) == (0, n_keys):
        return chunk, slice(0, n_keys)

    def keys(a: Any) -> Any:
        return a if a is None or a.shape[-1] == 1 else a[..., low:high]

    return chunk._replace(
        k=chunk.k[..., low:high, :],
        v=chunk.v[..., low:high, :],
        allowed=keys(allowed),
        bias=keys(chunk.bias),
        alibi=keys(chunk.alibi),
    ), slice(low, high)


def _split(a: Any, width: int, count: int) -> tuple[Any, ...]:
    """The ``count`` column blocks of ``width`` of ``a`` (its sums with v, |v|, v*v)."""
    return tuple(a[..., i * width : (i + 1) * width] for i in range(count))


def _moved_weights_saturated(
    xp: ModuleType, weights: Any, log_weights: Array, delta: Any, allowed: Array
) -> Any:
    """g_ij = p_ij (e^Delta_ij - 1) of TOL-2 (0 for keys outside S(i)) where some Delta_ij
    reach 1, at most _SATURATED_WEIGHT_ERROR: accurate for small Delta, and
    e^(log p + Delta) where p underflows but a perturbed weight need not (a key padded
    with a large finite bias)."""
    small = delta < 1
    zero = xp.zeros_like(delta)
    moved = xp.where(
        small,
        weights * xp.expm1(xp.where(small, delta, zero)),
        xp.exp(xp.minimum(log_weights + delta, xp.ones_like(delta))) - weights,
    )
    return xp.where(allowed, xp.minimum(moved, xp.full_like(moved, _SATURATED_WEIGHT_ERROR)), zero)


def _lse_bound(
    xp: ModuleType,
    dtype: str,
    row_max: Array,
    total: Any,
    log_weights: Array,
    delta: Any,
    allowed: Array,
    n_keys: int,
) -> tuple[Any, Any]:
    """The log-sum-exp of LSE-1 and its TOL-5 bound, per row ``(..., rows, 1)``.

    Every computed term exp(s_ij - m) carries a factor e^eps_ij with |eps_ij| <= Delta_ij,
    so the computed log-sum-exp lies in [lse - lambda^-, lse + lambda^+] with
    lambda^+- = +-log sum_j p_ij e^(+-Delta_ij), evaluated in the log domain (stable for
    keys whose weight underflows).
    """
    if n_keys == 0:  # no keys: -inf, compared exactly (TOL-3)
        empty = xp.full(
            (*allowed.shape[:-1], 1),
            -xp.inf,
            dtype=total.dtype,
            device=array_api_compat.device(total),
        )
        return empty, xp.zeros_like(empty)
    attends = xp.any(allowed, axis=-1, keepdims=True)
    lse = xp.where(attends, row_max + xp.log(total), xp.full_like(row_max, -xp.inf))
    # what both signs share: the weights, and the rows whose |delta| are all below 1
    none = xp.zeros_like(delta)
    weights = xp.where(allowed, xp.exp(log_weights), none)
    small = xp.all(
        xp.logical_or(xp.abs(delta) < 1, xp.logical_not(allowed)), axis=-1, keepdims=True
    )
    spread = xp.maximum(
        _log_mean_exp(xp, log_weights, weights, small, delta, allowed),
        -_log_mean_exp(xp, log_weights, weights, small, -delta, allowed),
    )
    tolerance = SAFETY_FACTOR * (spread + lse_final_error(dtype, n_keys, row_max, xp))
    return lse, xp.where(attends, tolerance, xp.zeros_like(tolerance))


def _log_mean_exp(
    xp: ModuleType,
    log_weights: Array,
    weights: Any,
    small: Any,
    delta: Any,
    allowed: Array,
) -> Any:
    """log sum_j p_ij e^(delta_ij) over allowed j, keepdims (0 for rows with none);
    ``weights`` are exp(log p_ij) (0 outside S(i)), ``small`` the rows whose |delta| are
    all below 1 (those of -delta too).

    Rows whose |delta| are all below 1 use log1p(sum_j p_ij expm1(delta_ij)), accurate
    however small delta is; other rows the log domain, stable for keys whose weight
    underflows however large their delta."""
    none = xp.zeros_like(delta)
    moved = xp.sum(
        weights * xp.expm1(xp.where(allowed, xp.clip(delta, -1.0, 1.0), none)),
        axis=-1,
        keepdims=True,
    )
    terms = xp.where(allowed, log_weights + delta, xp.full_like(delta, -xp.inf))
    top = xp.max(terms, axis=-1, keepdims=True) if terms.shape[-1] else terms[..., :1]
    top = xp.where(xp.isfinite(top), top, xp.zeros_like(top))
    total = xp.sum(xp.where(allowed, xp.exp(terms - top), none), axis=-1, keepdims=True)
    in_log_domain = top + xp.log(xp.where(total > 0, total, xp.ones_like(total)))
    return xp.where(small, xp.log1p(moved), in_log_domain)


@shows_options(ScoreOptions)
def dropout_error_bound(
    q: Array,
    k: Array,
    v: Array,
    *,
    dtype: str,
    dropout_p: float,
    dropout_keep: Array,
    **given: Unpack[ScoreOptions],
) -> tuple[Any, Any]:
    """DROP-2's output for the keep indicators ``dropout_keep`` in float64, and its TOL-6
    bound: each kept weight's TOL-2 bound (and (L_k + 2) u_a of its size for the rescaling
    and the sum), rescaled by 1 / (1 - p), plus the output rounding and the floor."""
    options = filled(ScoreOptions, given)
    out = plain_attention(q, k, v, dropout_p=dropout_p, dropout_keep=dropout_keep, **options)
    bound = error_bound(q, k, v, dtype=dtype, weights=True, **options)
    xp = array_api_compat.array_namespace(out)
    n_keys, n_q_heads, n_kv_heads = k.shape[-2], q.shape[-3], k.shape[-3]
    u_a = accumulation_roundoff(dtype)
    kept = xp.astype(xp.broadcast_to(dropout_keep, bound.weights.shape), out.dtype)
    charged = kept * (bound.weights_tolerance + SAFETY_FACTOR * (n_keys + 2) * u_a * bound.weights)
    *batch, _, n_queries, _ = charged.shape
    grouped = xp.reshape(charged, (*batch, n_kv_heads, n_q_heads // n_kv_heads, n_queries, n_keys))
    values = xp.broadcast_to(v, (*batch, *v.shape[-3:]))
    abs_values = xp.abs(xp.where(xp.isfinite(values), values, xp.zeros_like(values)))
    spread = xp.reshape(xp.matmul(grouped, abs_values[..., None, :, :]), out.shape)
    finite_out = xp.where(xp.isfinite(out), out, xp.zeros_like(out))
    tolerance = (
        spread / (1 - dropout_p)
        + SAFETY_FACTOR * UNIT_ROUNDOFF[dtype] * xp.abs(finite_out)
        + (n_keys + 2) * UNDERFLOW_THRESHOLD[dtype]
    )
    return out, xp.where(xp.isfinite(out), tolerance, xp.zeros_like(out))
