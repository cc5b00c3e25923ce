"""Linear (kernelized) attention exactly as spec/linear.md defines it (LIN-1 … LIN-5).

``out_i = phi(q_i)^T (sum_j psi(k_j) v_j^T) / (phi(q_i)^T sum_j psi(k_j))`` with non-negative
feature maps ``phi`` (queries) and ``psi`` (keys), usually the same map.  Time and memory are
linear in the sequence lengths: no ``Lq x Lk`` array is ever formed, not even for the causal
form, which uses prefix sums over the keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

import array_api_compat

from ._array import Array
from ._checks import check_choice, check_flag
from .masks import CAUSAL_ALIGNMENTS, causal_offset
from .options import filled, shows_options
from .sdpa import prepare
from .tolerance import SAFETY_FACTOR, UNDERFLOW_THRESHOLD, UNIT_ROUNDOFF, accumulation_roundoff

if TYPE_CHECKING:
    from typing import Unpack

CALL = "linear_attention(q, k, v)"
# Keys whose prefix sums (chunk x F x Ev numbers) exist at once in the causal form: with
# F = Ev = 64, 256 keys are 4 MiB per head, which stays in cache.
PREFIX_CHUNK = 256

FeatureMap = Callable[[Any], Any]


class FeatureMapPair(NamedTuple):
    """Separate maps for queries and keys: the same map up to the stabilisers of LIN-4.6."""

    queries: FeatureMap
    keys: FeatureMap


class LinearOptions(TypedDict, total=False):
    """The causal rule (LIN-2.1) and the declared denominator epsilon (LIN-3.2)."""

    is_causal: bool
    causal_alignment: str
    eps: float


class _FeatureMap(TypedDict):
    feature_map: FeatureMap | tuple[FeatureMap, FeatureMap]


class LinearAttentionOptions(_FeatureMap, LinearOptions, total=False):
    """``linear_attention``'s keywords: ``feature_map`` is required."""


class _Dtype(TypedDict):
    dtype: str


class _BoundSettings(_Dtype, total=False):
    feature_error: float | None


class LinearBoundOptions(_FeatureMap, _BoundSettings, LinearOptions, total=False):
    """``linear_error_bound``'s keywords: ``feature_map`` and ``dtype`` are required."""


class LinearErrorBound(NamedTuple):
    """The float64 evaluation of LIN-1.2/LIN-2.1 and the allowed error of LIN-5.2, per element."""

    out: Any
    out_tolerance: Any


def elu_plus_one(x: Array) -> Array:
    """``elu(x) + 1``: ``x + 1`` for ``x > 0``, ``exp(x)`` otherwise (LIN-4.1), elementwise."""
    xp = array_api_compat.array_namespace(x)
    non_positive = x <= 0
    # exp only ever sees non-positive numbers, so the branch not taken cannot overflow;
    # NaN fails ``x <= 0`` and propagates through ``x + 1``.
    return xp.where(non_positive, xp.exp(xp.where(non_positive, x, xp.zeros_like(x))), x + 1)


def relu_features(x: Array) -> Array:
    """``max(x, 0)`` elementwise (LIN-4.2); NaN propagates."""
    xp = array_api_compat.array_namespace(x)
    return xp.where(x < 0, xp.zeros_like(x), x)


def _feature_maps(feature_map: Any, call: str) -> FeatureMapPair:
    if callable(feature_map):
        return FeatureMapPair(feature_map, feature_map)
    if (
        isinstance(feature_map, tuple)
        and len(feature_map) == 2
        and all(callable(f) for f in feature_map)
    ):
        return FeatureMapPair(*feature_map)
    raise TypeError(
        f"feature_map={feature_map!r}, but should be a callable phi(x) or a pair "
        f"(query_map, key_map) of callables [LIN-1.1, {call}]"
    )


def _check_eps(eps: Any, call: str) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps={eps!r}, but should be a real number >= 0 [LIN-3.2, {call}]")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps={eps!r}, but should be finite and >= 0 [LIN-3.2, {call}]")
    return float(eps)


def _apply(xp: ModuleType, name: str, feature_map: FeatureMap, x: Any, call: str) -> Any:
    """``feature_map(x)`` checked against LIN-1.1 and LIN-1.3, in x's dtype."""
    features = feature_map(x)
    if not array_api_compat.is_array_api_obj(features):
        raise TypeError(
            f"the {name} feature map returned a {type(features).__name__}, but should return "
            f"an array [LIN-1.1, {call}]"
        )
    if tuple(features.shape[:-1]) != tuple(x.shape[:-1]):
        raise ValueError(
            f"the {name} feature map turned shape {tuple(x.shape)} into "
            f"{tuple(features.shape)}, but should only change the last axis [LIN-1.1, {call}]"
        )
    if not xp.isdtype(features.dtype, "real floating"):
        raise TypeError(
            f"the {name} feature map returned dtype {features.dtype}, but should return a "
            f"real floating dtype [LIN-1.1, {call}]"
        )
    if bool(xp.any(features < 0)):
        raise ValueError(
            f"the {name} feature map returned negative features, but should return "
            f"features >= 0 [LIN-1.3, {call}]"
        )
    return xp.astype(features, x.dtype)


def _numerator_denominator(
    xp: ModuleType, fq: Any, fk: Any, v: Array, offset: int | None
) -> tuple[Any, Any]:
    """``N = sum_j A_ij v_j`` and ``D = sum_j A_ij`` over the keys each query sees.

    ``A_ij = fq_i . fk_j`` is never formed.  ``offset`` is None for non-causal attention,
    else the d of SDPA-4.1/4.2: query i sees keys j <= i + d, through prefix sums.
    """
    n_queries, n_keys = fq.shape[-2], fk.shape[-2]
    # Without keys or queries the causal form is the (empty or all-zero) non-causal one.
    if offset is None or n_keys == 0 or n_queries == 0:
        state = xp.matmul(xp.matrix_transpose(fk), v)  # (..., F, Ev)
        numerator = xp.matmul(fq, state)
        denominator = xp.matmul(fq, xp.sum(fk, axis=-2)[..., :, None])
        return numerator, denominator
    return _prefix_sums(xp, fq, fk, v, offset)


def _prefix_sums(
    xp: ModuleType, fq: Any, fk: Any, v: Array, offset: int, chunk: int = PREFIX_CHUNK
) -> tuple[Any, Any]:
    """The causal ``N`` and ``D``: query i reads the prefix sums of ``fk_j v_j^T`` and
    ``fk_j`` up to key ``min(i + d, Lk - 1)``; rows with ``i + d < 0`` see no key.

    The prefix sums are ``(Lk, F, Ev)`` numbers; they are formed ``chunk`` keys at a time,
    each chunk starting from the sums of the keys before it, and read by the queries whose
    last key lies in the chunk, so memory and time stay linear in L with a small constant;
    the chunks past the last query's last key (top-left with Lq < Lk) are not formed.
    """
    n_queries, n_keys = fq.shape[-2], fk.shape[-2]
    device = array_api_compat.device(fq)
    blind = min(n_queries, max(0, -offset))  # rows i with i + d < 0
    batch = fq.shape[:-2]
    numerators = [xp.zeros((*batch, blind, v.shape[-1]), dtype=fq.dtype, device=device)]
    denominators = [xp.zeros((*batch, blind, 1), dtype=fq.dtype, device=device)]
    state = xp.zeros((*fk.shape[:-2], fk.shape[-1], v.shape[-1]), dtype=fk.dtype, device=device)
    total = xp.zeros((*fk.shape[:-2], fk.shape[-1]), dtype=fk.dtype, device=device)
    for start in range(0, n_keys, chunk):
        stop = min(start + chunk, n_keys)
        states = state[..., None, :, :] + xp.cumulative_sum(
            fk[..., start:stop, :, None] * v[..., start:stop, None, :], axis=-3
        )
        sums = total[..., None, :] + xp.cumulative_sum(fk[..., start:stop, :], axis=-2)
        # the queries whose last key is in this chunk; the last chunk also takes the rows
        # after the last key (top-left with Lq > Lk), which see every key
        first = min(n_queries, max(blind, start - offset))
        last = n_queries if stop == n_keys else min(n_queries, max(blind, stop - offset))
        if last > first:
            position = (
                xp.clip(xp.arange(first, last, device=device) + offset, start, stop - 1) - start
            )
            rows = fq[..., first:last, :]
            numerators.append(
                xp.matmul(rows[..., :, None, :], xp.take(states, position, axis=-3))[..., 0, :]
            )
            denominators.append(
                xp.sum(rows * xp.take(sums, position, axis=-2), axis=-1, keepdims=True)
            )
        if last == n_queries:
            break  # every row is read (top-left with Lq < Lk): no query sees a later key
        state, total = states[..., -1, :, :], sums[..., -1, :]
    return xp.concat(numerators, axis=-2), xp.concat(denominators, axis=-2)


def _divide(xp: ModuleType, numerator: Any, denominator: Any) -> Any:
    """``N / D`` with rows whose denominator is 0 giving exactly 0 (LIN-1.4)."""
    empty = denominator == 0
    safe = xp.where(empty, xp.ones_like(denominator), denominator)
    return xp.where(empty, xp.zeros_like(numerator), numerator / safe)


def _setup(
    q: Array, k: Array, v: Array, options: LinearAttentionOptions, call: str
) -> tuple[Any, Any, Any, int | None, float]:
    problem = prepare(q, k, v, call=call)
    is_causal = check_flag("is_causal", options["is_causal"], call)
    causal_alignment = check_choice(
        "causal_alignment", options["causal_alignment"], CAUSAL_ALIGNMENTS, call, "LIN-2.1"
    )
    eps = _check_eps(options["eps"], call)
    maps = _feature_maps(options["feature_map"], call)
    xp = problem.xp
    fq = _apply(xp, "query", maps.queries, problem.q, call)
    fk = _apply(xp, "key", maps.keys, problem.k, call)
    if fq.shape[-1] != fk.shape[-1]:
        raise ValueError(
            f"the query features have {fq.shape[-1]} entries and the key features "
            f"{fk.shape[-1]}, but should have the same number [LIN-1.1, {call}]"
        )
    n_queries, n_keys = problem.q.shape[-2], problem.k.shape[-2]
    offset = causal_offset(n_queries, n_keys, causal_alignment) if is_causal else None
    return problem, fq, fk, offset, eps


@shows_options(LinearAttentionOptions)
def linear_attention(
    q: Array, k: Array, v: Array, **given: Unpack[LinearAttentionOptions]
) -> Array:
    """Kernelized attention as spec/linear.md defines it.

    ``q (..., Hq, Lq, E)``, ``k (..., Hkv, Lk, E)``, ``v (..., Hkv, Lk, Ev)`` with the layout,
    broadcasting and grouped heads of SDPA-1.1/SDPA-6.1 give ``(..., Hq, Lq, Ev)`` in q's
    dtype (LIN-1.1).  ``feature_map`` maps ``(..., L, E)`` to non-negative ``(..., L, F)``;
    a pair ``(query_map, key_map)`` lets the two differ by stabilisers (LIN-4.6).  There is
    no scale: a map that wants one applies it.  ``is_causal`` restricts query i to the keys
    of ``causal_alignment`` (LIN-2.1); ``eps`` is a declared denominator epsilon (LIN-3.2).
    Rows whose denominator is 0 give 0 (LIN-1.4).
    """
    problem, fq, fk, offset, eps = _setup(q, k, v, filled(LinearAttentionOptions, given), CALL)
    xp = problem.xp
    numerator, denominator = _numerator_denominator(xp, fq, fk, problem.v, offset)
    out = _divide(xp, numerator, denominator + eps)
    return xp.astype(xp.reshape(out, problem.out_shape), problem.out_dtype)


@shows_options(LinearBoundOptions)
def linear_error_bound(
    q: Array, k: Array, v: Array, **given: Unpack[LinearBoundOptions]
) -> LinearErrorBound:
    """LIN-5.2 for float64 inputs holding values exactly representable in ``dtype``.

    ``feature_error`` bounds the relative error of each feature a kernel computes (``a`` of
    LIN-5.2); None means ``2 u_a``, right for elu+1 and relu.  FAVOR+ kernels get theirs
    from :func:`attnspec.reference.favor.favor_feature_error`.
    """
    call = "linear_error_bound(q, k, v)"
    options = filled(LinearBoundOptions, given)
    dtype, feature_error = options["dtype"], options["feature_error"]
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(
            f"dtype={dtype!r}, but should be one of {tuple(UNIT_ROUNDOFF)} [LIN-5.2, {call}]"
        )
    problem, fq, fk, offset, eps = _setup(q, k, v, options, call)
    xp = problem.xp
    if problem.q.dtype != xp.float64:
        raise TypeError(f"q.dtype={problem.q.dtype}, but should be float64 [LIN-5.2, {call}]")
    u_d, u_a = UNIT_ROUNDOFF[dtype], accumulation_roundoff(dtype)
    a = 2 * u_a if feature_error is None else float(feature_error)
    if not (math.isfinite(a) and a >= 0):
        raise ValueError(f"feature_error={feature_error!r}, but should be finite and >= 0 [{call}]")
    n_features, n_keys = fk.shape[-1], fk.shape[-2]

    numerator, denominator = _numerator_denominator(xp, fq, fk, problem.v, offset)
    magnitude, _ = _numerator_denominator(xp, fq, fk, xp.abs(problem.v), offset)
    shifted = denominator + eps
    out = _divide(xp, numerator, shifted)
    rho_d = 2 * (a + u_d) + (n_features + n_keys + 2) * u_a
    rho_n = rho_d + u_a
    bracket = (
        rho_n * _divide(xp, magnitude, shifted)
        + rho_d * xp.abs(out) * _divide(xp, denominator, shifted)
        + (u_a + u_d) * xp.abs(out)
    )
    tolerance = SAFETY_FACTOR * bracket + (n_features + n_keys + 2) * UNDERFLOW_THRESHOLD[dtype]
    tolerance = xp.where(xp.isfinite(out), tolerance, xp.zeros_like(out))
    return LinearErrorBound(
        out=xp.reshape(out, problem.out_shape),
        out_tolerance=xp.reshape(tolerance, problem.out_shape),
    )
