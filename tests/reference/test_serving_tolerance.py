"""How TOL-2 applies to the serving kernels (spec/serving.md): SINK-5, MERGE-4, MLA-3,
PAGED-7.  Each bound holds for an independently written float32 kernel (NumPy, emulating
the precision the clauses assume) and is broken by a kernel with one step done wrong, so
it is neither vacuous nor tuned."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import oracle_serving
import pytest

from attnspec.reference import tolerance
from attnspec.reference.serving import mla_attention, paged_attention
from attnspec.reference.tolerance_serving import merge_error_bound, sink_error_and_lse_bound

HALF = {"float16": np.float16, "float32": np.float32}


def _within(got: np.ndarray, expected: np.ndarray, bound: np.ndarray) -> bool:
    finite = np.isfinite(expected)
    return bool(np.all(np.abs(got[finite] - expected[finite]) <= bound[finite]))


def _sink_kernel(
    q: Any,
    k: Any,
    v: Any,
    sinks: Any,
    allowed: np.ndarray,
    scale: float,
    dtype: str,
    softcap: float | None = None,
    bug: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A float32 sink kernel (SINK-1, SINK-3): scaled (and capped) scores, max over scores
    and sink, exponentials, the sink's term added to the row sum, output rounded to
    ``dtype`` once; its log-sum-exp, the row max plus the log of the row sum.  ``bug``:
    "no-sink" leaves the sink out of the denominator, "scaled-sink" scales it,
    "lse-without-sink" leaves it out of the returned log-sum-exp alone."""
    q, k, v = (np.asarray(a, np.float32) for a in (q, k, v))
    scores = np.float32(scale) * (q @ np.swapaxes(k, -1, -2))
    if softcap is not None:
        scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
    scores = np.where(allowed, scores, -np.inf)
    sink = np.asarray(sinks, np.float32)[:, None, None]
    if bug == "scaled-sink":
        sink = sink * np.float32(scale)
    top = np.maximum(scores.max(-1, keepdims=True), sink)
    exps = np.exp(scores - top)
    total = exps.sum(-1, keepdims=True)
    if bug != "no-sink":
        total = total + np.exp(sink - top)
    out = (exps @ v) / np.where(total == 0, 1, total)
    scores_only = exps.sum(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = top + np.log(scores_only if bug == "lse-without-sink" else total)
    return out.astype(HALF[dtype]), lse[..., 0]


SINK_BOUND_CASES = [  # scale, softcap, causal (bottom-right, 6 queries on 20 keys)
    (0.3, None, False),
    (0.25, None, False),
    (0.3, 2.0, True),
    (0.25, 1.0, False),
]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_sink_bounds_hold_and_are_not_vacuous(dtype: str) -> None:
    """SINK-5, SINK-3: a correct float32 sink kernel's output is within TOL-2 and its
    log-sum-exp within TOL-5 of the problem with the sink as one more key (a mask with an
    empty row, large sinks, softcap, bottom-right causal); that log-sum-exp is the float64
    log(sum_j e^(s_ij) + e^(sink)), the sink itself for the empty row.  A kernel that leaves
    the sink out of the denominator or scales it is outside the output's bound, one that
    leaves it out of the log-sum-exp alone outside the log-sum-exp's."""
    for seed, (scale, softcap, causal) in enumerate(SINK_BOUND_CASES):
        rng = np.random.default_rng(20 + seed)
        q, k, v = (
            rng.standard_normal(s).astype(HALF[dtype]).astype(np.float64)
            for s in ((4, 6, 16), (4, 20, 16), (4, 20, 8))
        )
        mask = rng.random((6, 20)) < 0.8
        mask[2] = False
        allowed = mask & (np.arange(20)[None, :] <= np.arange(6)[:, None] + 14 if causal else True)
        sinks = np.array([0.0, 2.0, -3.0, 5.0])
        bound, lse_bound = sink_error_and_lse_bound(
            q,
            k,
            v,
            sinks,
            dtype=dtype,
            mask=mask,
            scale=scale,
            softcap=softcap,
            is_causal=causal,
            causal_alignment="bottom_right",
        )
        expected, _ = oracle_serving.attend(
            q, k, v, allowed.__getitem__, scale=scale, softcap=softcap, sinks=sinks
        )
        np.testing.assert_allclose(np.asarray(bound.out), expected, rtol=1e-12, atol=1e-300)
        scores = scale * (q @ np.swapaxes(k, -1, -2))
        if softcap is not None:
            scores = softcap * np.tanh(scores / softcap)
        log_denominator = np.log(
            np.where(allowed, np.exp(scores), 0.0).sum(-1) + np.exp(sinks)[:, None]
        )
        np.testing.assert_allclose(np.asarray(lse_bound.lse), log_denominator, rtol=1e-13)
        np.testing.assert_array_equal(np.asarray(lse_bound.lse)[:, 2], sinks)  # the empty row
        tolerance, lse_tolerance = (
            np.asarray(bound.out_tolerance),
            np.asarray(lse_bound.lse_tolerance),
        )
        out, lse = _sink_kernel(q, k, v, sinks, allowed, scale, dtype, softcap)
        assert _within(out.astype(np.float64), expected, tolerance), (dtype, seed)
        assert _within(lse.astype(np.float64), log_denominator, lse_tolerance), (dtype, seed)
        for bug in ("no-sink", "scaled-sink"):
            wrong, _ = _sink_kernel(q, k, v, sinks, allowed, scale, dtype, softcap, bug)
            assert not _within(wrong.astype(np.float64), expected, tolerance), (seed, bug)
        _, wrong_lse = _sink_kernel(
            q, k, v, sinks, allowed, scale, dtype, softcap, "lse-without-sink"
        )
        assert not np.all(np.abs(wrong_lse - log_denominator) <= lse_tolerance), seed


def _merge_kernel(
    o_a: np.ndarray,
    l_a: np.ndarray,
    o_b: np.ndarray,
    l_b: np.ndarray,
    *,
    lse_first: bool,
    base_two: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """A float32 merge (MERGE-1, MERGE-3): the max shift (by 0 where both states are
    empty, as vLLM's CUDA merge returns early there), exponentials in float32, two ways of
    forming the weights; ``base_two`` reads natural log-sum-exps as base 2 (a bug)."""
    exp = np.exp2 if base_two else np.exp
    l_a, l_b = np.asarray(l_a, np.float32), np.asarray(l_b, np.float32)
    top = np.maximum(l_a, l_b)
    empty = top == -np.inf
    top = np.where(empty, np.float32(0), top)
    parts = [
        np.where((l == -np.inf)[..., None], np.float32(0), o.astype(np.float32))
        for o, l in ((o_a, l_a), (o_b, l_b))
    ]
    if lse_first:
        with np.errstate(invalid="ignore"):  # np.where computes the discarded -inf - -inf
            gap = np.where(empty, np.float32(np.inf), np.abs(l_a - l_b))
        lse = np.where(empty, -np.inf, top + np.log1p(exp(-gap)))
        w_a, w_b = (np.where(empty, 0, exp(l - np.where(empty, 0, lse))) for l in (l_a, l_b))
        out = w_a[..., None] * parts[0] + w_b[..., None] * parts[1]
    else:
        w_a, w_b = exp(l_a - top), exp(l_b - top)
        total = w_a + w_b
        lse = np.where(empty, -np.inf, top + np.log(np.where(empty, 1, total)))
        safe = np.where(empty, 1, total)[..., None]
        out = (w_a[..., None] * parts[0] + w_b[..., None] * parts[1]) / safe
    return out.astype(o_a.dtype), lse.astype(np.float32)


@pytest.mark.parametrize("magnitude", [1.0, 1e3])
def test_merge_bound_holds_and_is_not_vacuous(magnitude: float) -> None:
    """MERGE-4: two correct float32 merges of float16 states are within the bound for
    log-sum-exps of size 1 and 1000, empty states included; a merge that reads the
    log-sum-exps in base 2 is not."""
    rng = np.random.default_rng(21)
    o_a, o_b = rng.standard_normal((2, 4, 50, 8)).astype(np.float16)
    l_a = (rng.standard_normal((4, 50)) * magnitude).astype(np.float32)
    l_b = (l_a + rng.standard_normal((4, 50)) * 3).astype(np.float32)
    l_a[0, :5] = -np.inf
    l_a[1, :5] = l_b[1, :5] = -np.inf
    bound = merge_error_bound(
        o_a.astype(np.float64),
        l_a.astype(np.float64),
        o_b.astype(np.float64),
        l_b.astype(np.float64),
        dtype="float16",
    )
    expected_o, expected_l = oracle_serving.merge(o_a, l_a, o_b, l_b)
    np.testing.assert_allclose(np.asarray(bound.out), expected_o, rtol=1e-12, atol=1e-300)
    for lse_first in (False, True):
        out, lse = _merge_kernel(o_a, l_a, o_b, l_b, lse_first=lse_first)
        assert _within(out.astype(np.float64), expected_o, np.asarray(bound.out_tolerance))
        assert _within(lse.astype(np.float64), expected_l, np.asarray(bound.lse_tolerance))
    wrong, _ = _merge_kernel(o_a, l_a, o_b, l_b, lse_first=False, base_two=True)
    assert not _within(wrong.astype(np.float64), expected_o, np.asarray(bound.out_tolerance))
    assert np.max(np.asarray(bound.out_tolerance)) < 0.05


def test_mla_reference_in_half_precision_is_within_tol2() -> None:
    """MLA-3: at DeepSeek's dims (E = 576, Ev = 512) the reference's float16 result is within
    TOL-2 with the explicit scale; with 1/sqrt(576) instead (the wrong default) it is not."""
    rng = np.random.default_rng(22)
    q = rng.standard_normal((8, 4, 576)).astype(np.float16)
    kv = rng.standard_normal((1, 40, 576)).astype(np.float16)
    scale = 192**-0.5
    bound = tolerance.error_bound(
        q.astype(np.float64),
        kv.astype(np.float64),
        kv[..., :512].astype(np.float64),
        dtype="float16",
        scale=scale,
        weights=False,
    )
    out = mla_attention(q, kv, value_dim=512, scale=scale).astype(np.float64)
    expected = np.asarray(bound.out)
    assert _within(out, expected, np.asarray(bound.out_tolerance))
    wrong = mla_attention(q, kv, value_dim=512, scale=576**-0.5).astype(np.float64)
    assert not _within(wrong, expected, np.asarray(bound.out_tolerance))


def test_paged_reference_in_half_precision_is_within_tol2() -> None:
    """PAGED-7: each sequence's float16 rows of the reference are within TOL-2 of its own
    problem (keys gathered through the table, bottom-right causal with its L_k)."""
    rng = np.random.default_rng(23)
    page, seq_q, seq_k = 16, [5, 1, 3], [40, 17, 2]
    table = rng.permutation(9)[:9].reshape(3, 3).astype(np.int32)
    k_cache = rng.standard_normal((9, 2, page, 32)).astype(np.float16)
    v_cache = rng.standard_normal((9, 2, page, 16)).astype(np.float16)
    cu_q = np.concatenate([[0], np.cumsum(seq_q)]).astype(np.int32)
    q = rng.standard_normal((int(cu_q[-1]), 4, 32)).astype(np.float16)
    out = paged_attention(
        q, k_cache, v_cache, cu_q, np.array(seq_k, np.int32), table, is_causal=True
    )
    for b in range(3):
        keys = np.stack([k_cache[table[b][t // page], :, t % page] for t in range(seq_k[b])], 1)
        values = np.stack([v_cache[table[b][t // page], :, t % page] for t in range(seq_k[b])], 1)
        rows = q[cu_q[b] : cu_q[b + 1]].transpose(1, 0, 2)
        bound = tolerance.error_bound(
            rows.astype(np.float64),
            keys.astype(np.float64),
            values.astype(np.float64),
            dtype="float16",
            is_causal=True,
            causal_alignment="bottom_right",
            weights=False,
        )
        got = out[cu_q[b] : cu_q[b + 1]].transpose(1, 0, 2).astype(np.float64)
        assert _within(got, np.asarray(bound.out), np.asarray(bound.out_tolerance)), b
    assert math.isfinite(float(np.abs(out).max()))
