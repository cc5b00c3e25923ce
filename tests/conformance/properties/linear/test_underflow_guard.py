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
