"""LIN-5.2's underflow guard of the linear properties (conformance/properties/linear.py:
``within_underflow_guard``): it keeps out the rows a flush-to-zero kernel may zero, and
every problem the properties draw lies inside it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import oracle_linear
import pytest
from support import verdict_of

from attnspec.conformance import LinearClaim, declare
from attnspec.conformance.judge.properties.linear import within_underflow_guard
from attnspec.conformance.judge.verdict import PASSED
from attnspec.reference.linear import (
    elu_plus_one,
    linear_attention,
    linear_error_bound,
    relu_features,
)
from attnspec.reference.masks import causal_offset
from attnspec.reference.tolerance import accumulation_roundoff

# LIN-5.2's lambda_d: the dtype's smallest normal number
SMALLEST_NORMAL = {"float16": 2.0**-14, "bfloat16": 2.0**-126, "float32": 2.0**-126}


def _ftz_float32_linear(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """elu+1 linear attention (quadratic form) in float32 with flush-to-zero, as GPUs and XLA
    compute: every product or sum below float32's smallest normal number becomes 0."""
    tiny = np.float32(2.0**-126)

    def flush(a: np.ndarray) -> np.ndarray:
        return np.where(np.abs(a) < tiny, np.float32(0), a).astype(np.float32)

    fq, fk = (flush(oracle_linear.elu_plus_one(a).astype(np.float32)) for a in (q, k))
    terms = flush(fq[..., :, None, :] * fk[..., None, :, :])  # (..., Lq, Lk, F)
    a = flush(terms.sum(axis=-1, dtype=np.float32))
    numerator = flush(a @ v.astype(np.float32))
    denominator = flush(a.sum(axis=-1, keepdims=True, dtype=np.float32))
    safe = np.where(denominator == 0, np.float32(1), denominator)
    return np.where(denominator == 0, 0, numerator / safe).astype(np.float64)


@pytest.mark.parametrize(("shift", "inside"), [(-45.0, False), (-25.0, True)])
def test_underflow_guard_covers_products_under_flush_to_zero(shift: float, inside: bool) -> None:
    """LIN-5.2: with every elu+1 feature near e^-45 — above the e^-80 the guard used to ask
    for — the products phi_if psi_jf are near e^-90, below float32's smallest normal number,
    and a flush-to-zero kernel (the arithmetic TOL-2 admits) returns 0 rows, far outside the
    bound: the new guard (products >= 2^-101) puts those rows outside.  Near e^-25
    (products e^-50) every row is inside and the same kernel is within the bound."""
    rng = np.random.default_rng(7)
    q, k = (rng.uniform(-1, 1, (1, 3, 4)) + shift for _ in range(2))
    v = rng.standard_normal((1, 3, 2))
    q, k, v = (a.astype(np.float32).astype(np.float64) for a in (q, k, v))
    bound = linear_error_bound(q, k, v, feature_map=elu_plus_one, dtype="float32")
    out = _ftz_float32_linear(q, k, v)
    within = np.abs(out - bound.out) <= bound.out_tolerance
    guarded = within_underflow_guard(
        oracle_linear.elu_plus_one(q), oracle_linear.elu_plus_one(k), v, "float32", None
    )
    assert guarded.all() == inside and guarded.any() == inside
    assert within.all() == inside
    features = np.concatenate(
        [oracle_linear.elu_plus_one(q), oracle_linear.elu_plus_one(k)], axis=-2
    )
    assert features.min() > math.exp(-80)  # the old guard held in both cases
    products = (
        oracle_linear.elu_plus_one(q)[..., :, None, :]
        * oracle_linear.elu_plus_one(k)[..., None, :, :]
    )
    assert (products.min() >= 2.0**-101) == inside


@pytest.mark.parametrize("map_name", ["elu+1", "relu"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_linear_property_draws_stay_inside_the_guard(map_name: str, dtype: str) -> None:
    """LIN-5.2: every problem linear-matches-formula and linear-causal-prefix give a named
    map (quick profile: small and realistic strata) lies inside the underflow guard in every
    row, so no row is skipped, and the reference passes both."""
    seen: list[tuple[np.ndarray, ...]] = []
    features = oracle_linear.elu_plus_one if map_name == "elu+1" else oracle_linear.relu
    reference_map = elu_plus_one if map_name == "elu+1" else relu_features

    def kernel(q: Any, k: Any, v: Any, *, is_causal: bool = False) -> Any:
        seen.append((*(np.asarray(a, dtype=np.float64) for a in (q, k, v)), is_causal))
        return linear_attention(q, k, v, feature_map=reference_map, is_causal=is_causal)

    declared = declare(
        kernel, gqa=True, mask=False, scale=False, dtypes=(dtype,), linear=LinearClaim(map_name)
    )
    for property_id in ("linear-matches-formula", "linear-causal-prefix"):
        result = verdict_of(property_id, declared)
        assert result.status == PASSED, result.detail
    assert len(seen) > 40
    assert max(k.shape[-2] for _, k, _, _ in seen) >= 512, "no realistic stratum was drawn"
    for q, k, v, causal in seen:
        offset = causal_offset(q.shape[-2], k.shape[-2], "top_left") if causal else None
        assert within_underflow_guard(features(q), features(k), v, dtype, offset).all()


def _guard_by_loops(
    fq: np.ndarray, fk: np.ndarray, v: np.ndarray, dtype: str, offset: int | None
) -> np.ndarray:
    """LIN-5.2's guard, one product at a time (shapes (H, L, F), one key head per query
    head): row i is inside when every nonzero phi_if, psi_jf (2 lambda_d) and every nonzero
    phi_if psi_jf, psi_jf |v_jc|, phi_if psi_jf |v_jc| (2 lambda_a / u_a) of the keys j it
    sees is large enough."""
    feature_least = 2 * SMALLEST_NORMAL[dtype]
    product_least = 2 * 2.0**-126 / accumulation_roundoff(dtype)

    def fine(x: float, least: float) -> bool:
        return bool(x == 0 or x >= least)

    heads, n_queries, n_features = fq.shape
    inside = np.zeros((heads, n_queries, 1), dtype=bool)
    for h in range(heads):
        for i in range(n_queries):
            ok = all(fine(fq[h, i, f], feature_least) for f in range(n_features))
            for j in range(fk.shape[1]):
                if offset is not None and j > i + offset:
                    continue  # a key the row does not see
                for f in range(n_features):
                    phi, psi = fq[h, i, f], fk[h, j, f]
                    ok &= fine(psi, feature_least) and fine(phi * psi, product_least)
                    for value in np.abs(v[h, j]):
                        ok &= fine(psi * value, product_least)
                        ok &= fine(phi * psi * value, product_least)
            inside[h, i, 0] = ok
    return inside


def test_underflow_guard_is_the_guard_product_by_product() -> None:
    """LIN-5.2: the guard (which skips the products of features whose smallest nonzero
    ones are already large enough) keeps exactly the rows a product-by-product check
    keeps, on features and values around the thresholds, with zeros, negative numbers,
    inf and NaN among them."""
    rng = np.random.default_rng(33)
    kept = 0
    for _ in range(300):
        heads, n_queries, n_keys = (int(n) for n in rng.integers([1, 0, 0], [3, 4, 4]))
        n_features, n_values = (int(n) for n in rng.integers(1, 4, size=2))
        dtype = str(rng.choice(list(SMALLEST_NORMAL)))
        offset = None if rng.random() < 0.5 else int(rng.integers(-1, 2))

        def draw(*shape: int) -> np.ndarray:
            x = 2.0 ** rng.uniform(-130, 2, shape)  # straddles 2 lambda_d and 2 lambda_a / u_a
            odd = rng.choice([0.0, -1.0, np.inf, np.nan], shape)
            return np.where(rng.random(shape) < 0.15, odd, x)

        fq, fk = draw(heads, n_queries, n_features), draw(heads, n_keys, n_features)
        v = draw(heads, n_keys, n_values)
        with np.errstate(invalid="ignore", over="ignore"):
            expected = _guard_by_loops(fq, fk, v, dtype, offset)
            guarded = within_underflow_guard(fq, fk, v, dtype, offset)
        assert np.array_equal(guarded, expected), (fq, fk, v, dtype, offset)
        kept += int(expected.sum())
    assert 0 < kept < 300 * 2 * 3  # both outcomes met
