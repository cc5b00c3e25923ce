"""LIN-2, LIN-5 and LIN-6: linear (kernelized) attention against its own formula.

A kernel declares its feature map (``LinearClaim``).  Deterministic maps are compared
element by element with the float64 formula within LIN-5.2; FAVOR+ kernels, whose
features are random, are checked by the statistical acceptance test of LIN-6.2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ....reference.linear import elu_plus_one, linear_error_bound, relu_features
from ....reference.masks import causal_offset
from ....reference.tolerance import accumulation_roundoff
from ...call.problem import Problem
from ...claims.declaration import KernelDeclaration
from ...draw.strategies import (
    draw_dims,
    draw_dtype,
    draw_rng,
    random_problem,
    with_declared_batch,
)
from ..assertions import assert_within_bound
from ..failures import PropertyFailure
from ..favor_bound import (
    FAVOR_TEST_HEAD_DIM,
    FAVOR_TEST_QUERIES,
    ROUNDING_DTYPES,
    favor_acceptance_test,
)
from ..kernel import KernelUnderTest
from ..registration import register
from ._helpers import assert_output_shape_and_dtype

NAMED_FEATURE_MAPS: dict[str, Callable[[Any], Any]] = {
    "elu+1": elu_plus_one,
    "relu": relu_features,
}
FAVOR = "favor+"
# The smallest normal numbers: of the dtype, where features are stored (lambda_d of LIN-5.2's
# guard), and of the accumulation format (lambda_a): float32 for half precision (SDPA-7.2).
SMALLEST_NORMAL = {
    "float16": 2.0**-14,
    "bfloat16": 2.0**-126,
    "float32": 2.0**-126,
    "float64": 2.0**-1022,
}
# Drawn inputs smaller than this in magnitude become 0, and elu+1 inputs are kept >= -8, so
# that every feature and product is far inside the guard (relu and elu+1 features >= 2^-6
# and e^-8; products of three such factors >= e^-22) in every dtype.
SNAP_TO_ZERO, ELU_INPUT_FLOOR = 2.0**-6, -8.0
QUERY_CHUNK_ELEMENTS = 2**22  # elements of phi_i psi_j products the guard holds at once


def within_underflow_guard(
    fq: np.ndarray, fk: np.ndarray, v: np.ndarray, dtype: str, offset: int | None
) -> np.ndarray:
    """Rows ``(..., Hq, Lq, 1)`` inside LIN-5.2's underflow guard.

    Every nonzero feature of the row and of the keys it sees is at least 2 lambda_d, and
    every nonzero phi_if psi_jf, psi_jf |v_jc| and phi_if psi_jf |v_jc| is at least
    2 lambda_a / u_a: then every rounding is relative, or (flushed to zero) an error below
    u_a of a term, which the bound already counts.  ``offset`` is the causal d, or None.
    """
    fk, v = (np.repeat(a, fq.shape[-3] // fk.shape[-3], axis=-3) for a in (fk, np.abs(v)))
    feature_least = 2 * SMALLEST_NORMAL[dtype]
    product_least = (
        2
        * SMALLEST_NORMAL["float64" if dtype == "float64" else "float32"]
        / (accumulation_roundoff(dtype))
    )
    keys = _fine(fk, feature_least, (-1,)) & _keys_fine(fk, v, product_least)  # (..., Lk)
    # The smallest nonzero |v_jc| of each key (0 when there is none: every product is then
    # 0): where phi_if psi_jf is 0 or at least the bound (> 0), its smallest nonzero product
    # with |v_jc| is the product with this one (rounding is monotonic), so the guard needs
    # (..., Lq, Lk, F) and never (..., Lq, Lk, F, Ev): realistic strata draw Lk in thousands.
    least_v = np.where(v > 0, v, np.inf).min(axis=-1, initial=np.inf)
    least_v = np.where(np.isinf(least_v), 0.0, least_v)[..., None, :, None]  # (..., 1, Lk, 1)
    pairs_ok = _pairs_surely_fine(fq, fk, least_v[..., 0], product_least)
    if not pairs_ok.all():
        pairs_ok = _pairs_fine(fq, fk, least_v, product_least)
    ok = pairs_ok & keys[..., None, :]  # (..., Lq, Lk)
    if offset is not None:
        rows, cols = np.indices(ok.shape[-2:])
        ok = ok | (cols > rows + offset)  # keys the row does not see
    rows_ok: np.ndarray = (ok.all(axis=-1) & _fine(fq, feature_least, (-1,)))[..., None]
    return rows_ok


def _fine(a: np.ndarray, least: float, axes: tuple[int, ...]) -> np.ndarray:
    """Every element of ``a`` along ``axes`` is 0 or at least ``least``."""
    fits: np.ndarray = ((a == 0) | (a >= least)).all(axis=axes)
    return fits


def _least_nonzero(features: np.ndarray) -> np.ndarray:
    """Each row's smallest nonzero entry ``(..., L, 1)``: inf where all are 0, NaN where one
    is not finite (inf * 0 is NaN)."""
    nonzero = np.where(features != 0, features, np.inf)
    least = nonzero.min(axis=-1, keepdims=True, initial=np.inf)
    finite: np.ndarray = np.isfinite(features).all(axis=-1, keepdims=True)
    return np.where(finite, least, np.nan)


# The two "surely" shortcuts below skip the products of a row or key whose smallest nonzero
# entries already multiply to at least the bound: every nonzero product is then at least
# as large (rounding is monotonic).  A negative entry may make them say "fine" wrongly, but
# such a row or key fails its own feature check (2 lambda_d) and is outside anyway.
def _keys_fine(fk: np.ndarray, v: np.ndarray, least: float) -> np.ndarray:
    """``(..., Lk)``: every psi_jf |v_jc| is 0 or at least ``least``, without the
    (..., Lk, F, Ev) products where the smallest nonzero ones settle it."""
    with np.errstate(invalid="ignore", over="ignore"):
        surely: np.ndarray = (_least_nonzero(fk) * _least_nonzero(v) >= least)[..., 0]
    if surely.all():
        return surely
    return _fine(fk[..., :, :, None] * v[..., :, None, :], least, (-2, -1))


def _pairs_surely_fine(
    fq: np.ndarray, fk: np.ndarray, least_v: np.ndarray, least: float
) -> np.ndarray:
    """``(..., Lq, Lk)``: True where every phi_if psi_jf and its product with key j's
    smallest nonzero |v_jc| (``least_v``, ``(..., 1, Lk)``) is surely 0 or at least
    ``least`` without the (..., Lq, Lk, F) products; False is "look closer"
    (``_pairs_fine``), not "outside"."""
    row, key = _least_nonzero(fq), np.swapaxes(_least_nonzero(fk), -1, -2)
    with np.errstate(invalid="ignore", over="ignore"):
        lower = row * key  # (..., Lq, Lk); inf where a row or key has no nonzero feature
        with_v = np.where(least_v == 0, np.inf, lower * least_v)
    surely: np.ndarray = (lower >= least) & (with_v >= least)
    return surely


def _pairs_fine(fq: np.ndarray, fk: np.ndarray, least_v: np.ndarray, least: float) -> np.ndarray:
    """``(..., Lq, Lk)``: every phi_if psi_jf and its product with ``least_v`` (key j's
    smallest nonzero |v_jc|, ``(..., 1, Lk, 1)``) is 0 or at least ``least``, computed
    product by product in chunks of rows (bounded memory)."""
    n_queries, pair_elements = fq.shape[-2], max(1, fk[..., 0].size * fk.shape[-1])
    step = max(1, QUERY_CHUNK_ELEMENTS // pair_elements)  # rows per chunk, bounded memory
    chunks = []
    for start in range(0, max(n_queries, 1), step):  # one (empty) chunk when Lq = 0
        pairs = fq[..., start : start + step, None, :] * fk[..., None, :, :]  # (..., l, Lk, F)
        chunks.append(_fine(pairs, least, (-1,)) & _fine(pairs * least_v, least, (-1,)))
    return np.concatenate(chunks, axis=-2)


def _snapped(problem: Problem, map_name: Any) -> Problem:
    """The drawn problem with tiny inputs set to 0 and, for elu+1, q and k kept >= -8."""
    arrays = {
        name: np.where(np.abs(a) < SNAP_TO_ZERO, 0.0, a)
        for name, a in (("q", problem.q), ("k", problem.k), ("v", problem.v))
    }
    if map_name == "elu+1":
        arrays["q"], arrays["k"] = (np.maximum(arrays[n], ELU_INPUT_FLOOR) for n in ("q", "k"))
    return problem.with_(**arrays)


def deterministic_map(declaration: KernelDeclaration) -> str | None:
    claim = declaration.linear
    if claim is None:
        return "the kernel does not declare linear attention"
    if claim.feature_map == FAVOR:
        return "FAVOR+ features are random: checked by favor-error-bound (LIN-5.1)"
    return None


def causal_deterministic_map(declaration: KernelDeclaration) -> str | None:
    reason = deterministic_map(declaration)
    if reason is None and not declaration.causal:
        return "the kernel does not claim is_causal"
    return reason


def favor_map(declaration: KernelDeclaration) -> str | None:
    claim = declaration.linear
    if claim is None or claim.feature_map != FAVOR:
        return "the kernel does not declare FAVOR+ features"
    if not claim.num_features:
        return "a FAVOR+ kernel must declare num_features"
    if declaration.dtypes and not set(declaration.dtypes) & set(ROUNDING_DTYPES):
        return (
            "LIN-6.2 allows for the rounding of bfloat16, float32 and float64 only: FAVOR+ "
            "features in float16 fall below its smallest normal number"
        )
    return None


def feature_map_of(kernel: KernelUnderTest) -> Callable[[Any], Any]:
    claim = kernel.declaration.linear
    assert claim is not None
    if callable(claim.feature_map):
        feature_map: Callable[[Any], Any] = claim.feature_map
        return feature_map
    try:
        return NAMED_FEATURE_MAPS[claim.feature_map]
    except KeyError:
        raise PropertyFailure(
            f"feature_map={claim.feature_map!r}, but should be a callable or one of "
            f"{', '.join([*NAMED_FEATURE_MAPS, FAVOR])}"
        ) from None


def check_against_formula(kernel: KernelUnderTest, data: st.DataObject, causal: bool) -> None:
    claim = kernel.declaration.linear
    assert claim is not None
    dims = draw_dims(data, kernel, max_len=12, family="linear")
    dtype = draw_dtype(data, kernel)
    rng = draw_rng(data)
    magnitude = data.draw(st.sampled_from([1.0, 0.3, 3.0]), label="magnitude")
    problem = _snapped(
        random_problem(kernel, rng, dims, dtype, magnitude, is_causal=causal), claim.feature_map
    )
    raw, _ = kernel.call_on(problem)
    assert_output_shape_and_dtype(kernel, problem, raw)
    out = kernel.numpy(raw)
    feature_map = feature_map_of(kernel)
    bound = linear_error_bound(
        problem.q,
        problem.k,
        problem.v,
        feature_map=feature_map,
        dtype=dtype,
        is_causal=causal,
        causal_alignment=claim.causal_alignment,
        eps=claim.eps,
    )
    n_queries, n_keys = problem.q.shape[-2], problem.k.shape[-2]
    offset = causal_offset(n_queries, n_keys, claim.causal_alignment) if causal else None
    guarded = within_underflow_guard(
        np.asarray(feature_map(problem.q)),
        np.asarray(feature_map(problem.k)),
        problem.v,
        dtype,
        offset,
    )
    # LIN-5.2 says nothing about rows outside its guard (only a map the author supplies
    # can produce them: the named maps' draws are inside by construction)
    tolerance = np.where(guarded, np.asarray(bound.out_tolerance), np.inf)
    assert_within_bound(
        out, np.asarray(bound.out), tolerance, "out", problem, kernel, clause="LIN-5.2"
    )


@register("linear-matches-formula", "LIN-5.2", applies=deterministic_map)
def linear_matches_formula(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """The output equals phi(q_i)^T sum_j phi(k_j) v_j^T / phi(q_i)^T sum_j phi(k_j) with
    the declared map and epsilon, within the LIN-5.2 bound (Lq != Lk, GQA when claimed), in
    q's dtype and the spec's output shape (SDPA-1.3)."""
    check_against_formula(kernel, data, causal=False)


@register("linear-causal-prefix", "LIN-2.1", applies=causal_deterministic_map)
def linear_causal_prefix(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """With is_causal the output equals the masked quadratic form in the declared
    alignment (prefix sums), within LIN-5.2 — later keys do not count (LIN-2.2)."""
    check_against_formula(kernel, data, causal=True)


@register("favor-error-bound", "LIN-6.2", kind="fixed", applies=favor_map)
def favor_error_bound(kernel: KernelUnderTest, seed: int) -> None:
    """FAVOR+ weights pass the median-of-redraws acceptance test whose false-failure
    probability is at most 1e-6 (LIN-6.2, CONF-4)."""
    claim = kernel.declaration.linear
    assert claim is not None and claim.num_features
    dtype = next(d for d in reversed(kernel.dtypes) if d in ROUNDING_DTYPES)
    last: list[Problem] = []

    def estimate_weights(q: np.ndarray, k: np.ndarray, redraw_seed: int) -> np.ndarray:
        q, k, v = (with_declared_batch(kernel, a[None]) for a in (q, k, np.eye(k.shape[0])))
        problem = Problem(
            q=kernel.rounded(q, dtype),
            k=kernel.rounded(k, dtype),
            v=v,
            dtype=dtype,
            extra={claim.seed_keyword: redraw_seed},
        )
        last[:] = [problem]
        return kernel.output(problem).reshape(FAVOR_TEST_QUERIES, FAVOR_TEST_QUERIES)

    verdict = favor_acceptance_test(
        estimate_weights,
        n=FAVOR_TEST_QUERIES,
        head_dim=FAVOR_TEST_HEAD_DIM,
        num_features=claim.num_features,
        seed=seed,
        rounded=lambda a: kernel.rounded(a, dtype),
        dtype=dtype,
    )
    if not verdict.passed:
        raise PropertyFailure(verdict.message, last[0] if last else None, kernel)
