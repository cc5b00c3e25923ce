"""Sparse properties (SPARSE-6): each passes on correct kernels, zero false failures on a
stream of its own seed, and fails on a realistic buggy one.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import pytest
from family_kernels import (
    NUMPY,
    PATTERNS,
    allowed_values_sum,
    assert_status,
    pattern_of,
    reference_sparse,
)
from shared_draws import SharedDraws
from support import compiling, verdict_of

from attnspec.conformance import KernelUnderTest, SparseClaim, declare
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import FAILED, PASSED, WARNING
from attnspec.conformance.run.property_runner import PROFILES, Profile
from attnspec.reference import sparse_mask

ZERO_FALSE_FAILURE_SEED = 0  # the seed of the one stream of each property below

SPARSE_PROPERTIES = (
    "sparse-matches-dense",
    "sparse-weights-exactly-zero",
    "sparse-masked-ignored",
    "sparse-masked-nonfinite-ignored",
)


def masked_softmax_kernel(
    case: str, *, fill: float | None = None, zero_after_softmax: bool = False, left_shift: int = 0
) -> Any:
    """Dense NumPy attention over the pattern's mask, written independently of the
    reference; the keyword arguments inject one realistic bug each."""
    params, alignment, causal = PATTERNS[case]
    params = dict(params)
    if left_shift:
        params["left"] += left_shift

    @functools.cache
    def pattern_mask(n_q: int, n_k: int) -> np.ndarray:
        """The pattern's (Lq, Lk) mask, made once per pair of lengths (read only)."""
        mask = np.asarray(
            sparse_mask(
                pattern_of(case), n_q, n_k, alignment=alignment, causal=causal, xp=np, **params
            )
        )
        mask.flags.writeable = False
        return mask

    def kernel(q, k, v, *, scale=None):
        mask = pattern_mask(q.shape[-2], k.shape[-2])
        # by key/value-head group, (..., Hkv, G, L, X): each query head's products with its
        # group's K and V as with copies of them per query head (the same matrices), without
        # the copies
        heads = q.shape[-3]
        q = q.reshape(*q.shape[:-3], k.shape[-3], heads // k.shape[-3], *q.shape[-2:])
        k, v = k[..., None, :, :], v[..., None, :, :]
        s = q @ np.swapaxes(k, -1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)

        def per_query_head(out: np.ndarray) -> np.ndarray:
            return out.reshape(*out.shape[:-4], heads, *out.shape[-2:]).astype(q.dtype)

        if fill is not None:
            s = np.where(mask, s, fill)
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            return per_query_head((p / p.sum(axis=-1, keepdims=True)) @ v)
        masked = np.where(mask, s, -np.inf)
        peak = np.max(masked, axis=-1, keepdims=True, initial=-np.inf)
        peak = np.where(np.isfinite(peak), peak, 0.0)
        with np.errstate(over="ignore"):  # a row whose peak is +inf: exp is inf either way
            e = np.where(mask, np.exp(np.where(mask, s, 0.0) - peak), 0.0)
        total = e.sum(axis=-1, keepdims=True)
        p = e / np.where(total == 0, 1.0, total)
        if zero_after_softmax:
            return per_query_head(p @ v)  # 0 * NaN of masked values leaks
        # a masked key's NaN or inf must not reach the row (0 * NaN): only allowed keys
        return per_query_head(allowed_values_sum(p, mask, v))

    return declare(
        kernel,
        gqa=True,
        mask=False,
        causal=False,
        sparse=SparseClaim(pattern_of(case), PATTERNS[case][0], alignment, causal),
    )


@pytest.mark.parametrize("case", sorted(PATTERNS))
@pytest.mark.parametrize("property_id", SPARSE_PROPERTIES)
def test_sparse_properties_pass_on_correct_kernels(case: str, property_id: str) -> None:
    """SPARSE-6.1..6.4: the reference's gather kernels and an independent dense-masked
    NumPy kernel both pass for every pattern.  They declare the same claims, so they are
    drawn the same examples: the reference's passing examples are replayed on the other
    kernel (tests/shared_draws.py: one that does not replay runs on its own)."""
    shared = SharedDraws()
    for fn in (reference_sparse(case), masked_softmax_kernel(case)):
        result = shared.verdict(all_properties()[property_id], KernelUnderTest(fn, NUMPY))
        assert result.status == PASSED, (property_id, result.detail, result.counterexample)


def test_sparse_bugs_are_caught() -> None:
    """SPARSE-6: a window one key too wide, a finite -1e9 fill (tiny weights, mean(V) on
    empty rows) and a 0 * NaN leak are each caught by the property of their clause; the
    weights' leaks with the weights observed in column blocks too (SDPA-7.1, as on a
    backend that compiles per shape)."""
    assert_status(
        masked_softmax_kernel("sliding_window", left_shift=1), "sparse-matches-dense", FAILED
    )
    assert_status(
        masked_softmax_kernel("sliding_window", left_shift=1), "sparse-weights-exactly-zero", FAILED
    )
    assert_status(
        masked_softmax_kernel("sliding_window", left_shift=1), "sparse-masked-ignored", FAILED
    )
    assert_status(
        masked_softmax_kernel("sliding_window", fill=-1e9), "sparse-weights-exactly-zero", FAILED
    )
    # the weights observed in column blocks, as on a backend that compiles per shape
    for bug in (dict(left_shift=1), dict(fill=-1e9)):
        assert_status(
            masked_softmax_kernel("sliding_window", **bug),
            "sparse-weights-exactly-zero",
            FAILED,
            compiling(),
        )
    assert_status(
        masked_softmax_kernel("strided", zero_after_softmax=True),
        "sparse-masked-nonfinite-ignored",
        WARNING,
    )


# Zero false failures on one stream of examples a property, not 20 seeds of 2: every
# Hypothesis run starts with the same simplest problem, so the 20 seeds called the kernel on
# it 20 times (tests/catalogue/test_correct_pass.py, test_one_stream_draws_what_twenty_seeds_
# drew, measures the premise); one stream of 24 examples on seed 0 called the reference on
# 748 distinct inputs over the 7 patterns x 4 properties, the 20 seeds on 698 (counted by
# hand: a digest of q, k, v and the keywords of each call), at 56 % of the CPU time.
ONE_STREAM = Profile(24)


@pytest.mark.parametrize("case", sorted(PATTERNS))
def test_sparse_reference_passes_on_one_stream_per_property(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPARSE-6.1..6.4, zero false failures: the reference's sparse kernels pass every sparse
    property on a stream of 24 examples of its own seed (0: the quick profile's runs above
    draw from the unseeded streams), at least as many distinct problems as 20 seeds of 2
    examples each."""
    monkeypatch.setitem(PROFILES, "one-stream", ONE_STREAM)
    kernel = KernelUnderTest(reference_sparse(case), NUMPY)
    for property_id in SPARSE_PROPERTIES:
        result = verdict_of(property_id, kernel, profile="one-stream", seed=ZERO_FALSE_FAILURE_SEED)
        assert result.status == PASSED, (property_id, result.detail, result.counterexample)
