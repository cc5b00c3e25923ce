"""FAVOR+ positive random features for the softmax kernel (LIN-4.3 … LIN-4.6, LIN-6).

The projection is drawn in plain Python from ``random.Random(seed)`` in the order LIN-4.5
states, then handed to the array library: the same seed gives bit-identical projections
on every backend and device.
"""

from __future__ import annotations

import math
import operator
import random
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypedDict

import array_api_compat

from ._array import Array
from ._checks import check_flag, check_size, namespace_of, require_ndim_at_least
from .linear import FeatureMapPair, LinearOptions, linear_attention
from .masks import creation_namespace
from .options import filled, shows_options
from .sdpa import LAYOUT
from .tolerance import UNIT_ROUNDOFF, accumulation_roundoff

if TYPE_CHECKING:
    from typing import Unpack


def _dot(a: list[float], b: list[float]) -> float:
    return float(sum(map(operator.mul, a, b)))


def _orthonormal_rows(rows: list[list[float]]) -> list[list[float]]:
    """Modified Gram-Schmidt over the rows in order (QR with a positive diagonal)."""
    basis: list[list[float]] = []
    for row in rows:
        w = list(row)
        for b in basis:
            c = _dot(w, b)
            w = [wi - c * bi for wi, bi in zip(w, b, strict=True)]
        norm = math.sqrt(_dot(w, w))
        basis.append([wi / norm for wi in w])
    return basis


def _draw_projection(
    num_features: int, head_dim: int, seed: int, orthogonal: bool
) -> list[list[float]]:
    """The LIN-4.5 draw as a list of ``num_features`` rows of ``head_dim`` Python floats."""
    rng = random.Random(seed)

    def gaussian_row() -> list[float]:
        return [rng.gauss(0.0, 1.0) for _ in range(head_dim)]

    if not orthogonal:
        return [gaussian_row() for _ in range(num_features)]
    directions: list[list[float]] = []
    while len(directions) < num_features:
        block = _orthonormal_rows([gaussian_row() for _ in range(head_dim)])
        directions.extend(block[: num_features - len(directions)])
    # Norms from chi with head_dim degrees of freedom, drawn after all the directions.
    norms = [math.sqrt(_dot(g, g)) for g in (gaussian_row() for _ in range(num_features))]
    return [[n * d for d in direction] for n, direction in zip(norms, directions, strict=True)]


def favor_projection(
    num_features: int,
    head_dim: int,
    *,
    seed: int,
    orthogonal: bool = True,
    xp: ModuleType | None = None,
    device: Any = None,
) -> Array:
    """The ``(num_features, head_dim)`` float64 matrix W of FAVOR+ (LIN-4.4, LIN-4.5).

    Rows are iid ``N(0, I)`` or, with ``orthogonal=True``, orthogonal within blocks of
    ``head_dim`` rows with chi-distributed norms; either way each row is marginally
    ``N(0, I)``, which is what makes the estimator unbiased (LIN-6.1).
    """
    call = "favor_projection(num_features, head_dim, seed=...)"
    num_features = check_size("num_features", num_features, call, minimum=1)
    head_dim = check_size("head_dim", head_dim, call, minimum=1)
    seed = check_size("seed", seed, call)
    check_flag("orthogonal", orthogonal, call)
    xp, device = creation_namespace(xp, device)
    rows = _draw_projection(num_features, head_dim, seed, orthogonal)
    return xp.asarray(rows, dtype=xp.float64, device=device)


def _favor_logits(x: Any, projection: Array, call: str) -> Any:
    """``w_i . x~ - |x~|^2 / 2`` with ``x~ = x / E^(1/4)``, in x's dtype, shape (..., L, m)."""
    xp = namespace_of(call, x=x, projection=projection)
    if projection.ndim != 2 or projection.shape[1] != x.shape[-1]:
        raise ValueError(
            f"projection.shape={tuple(projection.shape)}, but should be (num_features, "
            f"{x.shape[-1]}) to match the head dim of x.shape={tuple(x.shape)} [LIN-4.3, {call}]"
        )
    scaled = x / x.shape[-1] ** 0.25
    w = xp.astype(projection, x.dtype)
    half_norm_sq = xp.sum(scaled * scaled, axis=-1)[..., None] / 2
    return xp.matmul(scaled, xp.matrix_transpose(w)) - half_norm_sq


def favor_features(x: Array, projection: Array) -> Array:
    """The FAVOR+ map of LIN-4.3 without stabiliser: ``m^(-1/2) exp(w_i . x~ - |x~|^2 / 2)``.

    ``phi(q) . phi(k)`` is an unbiased estimate of ``exp(q . k / sqrt(E))`` (LIN-6.1); it can
    overflow for large inputs, which is what the stabilised :func:`favor_feature_map` avoids.
    """
    xp = array_api_compat.array_namespace(x)
    logits = _favor_logits(x, projection, "favor_features(x, projection)")
    return xp.exp(logits) / math.sqrt(projection.shape[0])


def favor_feature_map(projection: Array) -> FeatureMapPair:
    """Stabilised FAVOR+ maps for queries and keys (LIN-4.3 with the LIN-4.6 stabilisers).

    Queries: each row's exponents are shifted by that row's maximum.  Keys: all exponents of
    one head (axes -2 and -1 together) are shifted by their common maximum.  Both shifts
    cancel in LIN-1.2, so ``linear_attention`` with this pair equals it with
    :func:`favor_features` in exact arithmetic, while no exponent exceeds 0.
    """
    call = "favor_feature_map(projection)"
    if (
        not array_api_compat.is_array_api_obj(projection)
        or projection.ndim != 2
        or (projection.shape[0] < 1)
    ):
        raise ValueError(
            f"projection={projection!r}, but should be a (num_features, head_dim) array with "
            f"num_features >= 1, as favor_projection returns [LIN-4.3, {call}]"
        )
    scale = 1 / math.sqrt(projection.shape[0])

    def queries(x: Any) -> Any:
        xp = array_api_compat.array_namespace(x)
        logits = _favor_logits(x, projection, call)
        return xp.exp(logits - xp.max(logits, axis=-1, keepdims=True)) * scale

    def keys(x: Any) -> Any:
        xp = array_api_compat.array_namespace(x)
        logits = _favor_logits(x, projection, call)
        if logits.shape[-2] == 0:
            return logits
        return xp.exp(logits - xp.max(logits, axis=(-2, -1), keepdims=True)) * scale

    return FeatureMapPair(queries, keys)


class _DrawnFrom(TypedDict):
    """What draws the projection (LIN-4.5), required."""

    num_features: int
    seed: int


class _Draw(_DrawnFrom, total=False):
    orthogonal: bool


class FavorOptions(_Draw, LinearOptions, total=False):
    """``favor_attention``'s keywords."""


@shows_options(FavorOptions)
def favor_attention(q: Array, k: Array, v: Array, **given: Unpack[FavorOptions]) -> Array:
    """Performer attention: :func:`linear_attention` with the FAVOR+ map drawn from ``seed``.

    One projection of ``num_features`` rows serves every batch element and head (LIN-4.3);
    the result estimates softmax attention with scale ``1/sqrt(E)`` (LIN-6).
    """
    call = "favor_attention(q, k, v, num_features=..., seed=...)"
    xp = namespace_of(call, q=q, k=k, v=v)
    require_ndim_at_least(call, "SDPA-1.1", 3, LAYOUT, q=q, k=k, v=v)
    options = filled(FavorOptions, given)
    projection = favor_projection(
        options["num_features"],
        q.shape[-1],
        seed=options["seed"],
        orthogonal=options["orthogonal"],
        xp=xp,
        device=array_api_compat.device(q),
    )
    feature_map = favor_feature_map(projection)
    return linear_attention(q, k, v, feature_map=feature_map, **filled(LinearOptions, options))


def favor_feature_error(q: Array, k: Array, projection: Array, *, dtype: str) -> float:
    """The relative error ``a`` of LIN-5.2 for FAVOR+ features computed in ``dtype``.

    ``exp((E + 7) u_a M) (1 + 2 u_a) - 1`` with ``M`` the largest
    ``sum_e |x~_e w_e| + |x~|^2 / 2`` over the rows of q and k and the features.
    """
    call = "favor_feature_error(q, k, projection, dtype=...)"
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype={dtype!r}, but should be one of {tuple(UNIT_ROUNDOFF)} [{call}]")
    xp = namespace_of(call, q=q, k=k, projection=projection)
    u_a = accumulation_roundoff(dtype)
    head_dim = projection.shape[-1]
    largest = 0.0
    for x in (q, k):
        if x.shape[-1] != head_dim:
            raise ValueError(
                f"head dim {x.shape[-1]}, but should equal the projection's {head_dim} "
                f"columns [LIN-4.3, {call}]"
            )
        scaled = xp.abs(xp.astype(x, xp.float64)) / head_dim**0.25
        bound = xp.matmul(scaled, xp.matrix_transpose(xp.abs(projection)))
        bound = bound + xp.sum(scaled * scaled, axis=-1)[..., None] / 2
        if bound.size:
            largest = max(largest, float(xp.max(bound)))
    return math.exp((head_dim + 7) * u_a * largest) * (1 + 2 * u_a) - 1
