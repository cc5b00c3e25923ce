"""TOL-4 and TOL-5 as tolerance.md displays them, against reference/tolerance.py.

The formulas are evaluated element by element from the text's terms (with the constants
the text states) and compared with the bound the reference computes with matrix products
and row chunks; then the bound is shown to hold for honest low-precision evaluations of
the features and to be tight enough to reject the classic mistakes.
"""

from __future__ import annotations

import math

import numpy as np
import oracle_features
import pytest

from attnspec.conformance.claims.clauses import SPEC_DIR
from attnspec.reference import tolerance
from attnspec.reference.tolerance import UNIT_ROUNDOFF, error_and_lse_bound

DISPLAYED = (
    r"+ [\text{softcap}]\,\big(u_a\,|\alpha| A_{ij} + (u_t + u_a)\,|\hat c_{ij}|\big)",
    r"+ [\text{ALiBi}]\,\big(u_a\,(|\alpha| A_{ij} + |b_{ij}|) + 5u_a\,|a_{ij}|\big),",
    r"\lambda^{\pm}_i = \pm \log \sum_{j \in S(i)} p_{ij}\, e^{\pm \Delta'_{ij}}",
    r"\tau^\ell_i = C\,\Big[\max(\lambda^+_i, \lambda^-_i) + (L_k - 1)\,u_a + 4u_a\,|m_i|"
    r" + 5u_a \log L_k\Big]",
)


def _displayed(q, k, bias, mask, slopes, cap, scale, dtype):
    """(D_i, tau^l_i) of TOL-2/TOL-4/TOL-5 for one head, one element at a time."""
    u_d = UNIT_ROUNDOFF[dtype]
    u_a = min(u_d, 2.0**-24)
    u_t = 2 * u_d if u_d > 2.0**-24 else 4 * u_a
    n_queries, head_dim = q.shape
    n_keys = k.shape[0]
    delta_offset = n_keys - n_queries  # bottom-right anchor
    d_rows, tau_rows = [], []
    for i in range(n_queries):
        allowed = [j for j in range(n_keys) if mask[i, j]]
        x = {j: scale * float(q[i] @ k[j]) for j in allowed}
        capped = {j: cap * math.tanh(x[j] / cap) for j in allowed}
        alibi = {j: -slopes * abs(i + delta_offset - j) for j in allowed}
        s = {j: capped[j] + bias[i, j] + alibi[j] for j in allowed}
        m = max(s.values())
        lse = m + math.log(sum(math.exp(s[j] - m) for j in allowed))
        deltas, g = {}, 0.0
        for j in allowed:
            a = abs(scale) * float(np.abs(q[i]) @ np.abs(k[j]))
            base = (
                (4 * u_d + (head_dim + 4) * u_a) * a
                + 2 * u_a * abs(bias[i, j])
                + 3 * u_a * (m - s[j])
                + 6 * u_a
            )
            deltas[j] = (
                base
                + u_a * a
                + (u_t + u_a) * abs(capped[j])
                + u_a * (a + abs(bias[i, j]))
                + 5 * u_a * abs(alibi[j])
            )
            p = math.exp(s[j] - lse)
            g += min(p * math.expm1(deltas[j]), 2.0)
        # log sum_j p_ij e^(+-Delta) = log1p(sum_j p_ij expm1(+-Delta)): exact for tiny Delta
        up = math.log1p(sum(math.exp(s[j] - lse) * math.expm1(deltas[j]) for j in allowed))
        down = -math.log1p(sum(math.exp(s[j] - lse) * math.expm1(-deltas[j]) for j in allowed))
        tau = 4 * (
            max(up, down) + (n_keys - 1) * u_a + 4 * u_a * abs(m) + 5 * u_a * math.log(n_keys)
        )
        d_rows.append(g)
        tau_rows.append(tau)
    return np.array(d_rows), np.array(tau_rows)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_displayed_formulas_agree_with_the_reference(dtype: str) -> None:
    """TOL-4, TOL-5: D_i (from Delta'_ij) and tau^l_i as displayed equal what
    error_bound computes, with softcap, ALiBi (bottom-right anchor), bias and a mask."""
    text = (SPEC_DIR / "tolerance.md").read_text(encoding="utf-8")
    for term in DISPLAYED:
        assert term in text, f"tolerance.md no longer displays {term}"
    rng = np.random.default_rng(11)
    n_queries, n_keys, head_dim, scale, cap, slope = 3, 6, 4, 0.75, 2.5, 0.25
    q, k, v, bias = (
        rng.integers(-8, 9, size=shape) / 4.0
        for shape in ((n_queries, head_dim), (n_keys, head_dim), (n_keys, 2), (n_queries, n_keys))
    )
    mask = rng.random((n_queries, n_keys)) < 0.7
    mask[:, 0] = True
    d, tau = _displayed(q, k, bias, mask, slope, cap, scale, dtype)
    bound, lse_bound = error_and_lse_bound(
        *(a[None] for a in (q, k, v)),  # one head
        dtype=dtype,
        mask=mask,
        bias=bias,
        scale=scale,
        softcap=cap,
        alibi_slopes=np.array([slope]),
        causal_alignment="bottom_right",
        chunk_elements=n_keys,
    )
    np.testing.assert_allclose(np.asarray(bound.score_error)[0], d, rtol=1e-9)
    np.testing.assert_allclose(np.asarray(lse_bound.lse_tolerance)[0], tau, rtol=1e-9)


def test_tanh_roundoff_constants() -> None:
    """TOL-4: u_t = 2u_d for float16/bfloat16, 4u_a for float32/float64."""
    assert tolerance.tanh_roundoff("float16") == 2.0**-10
    assert tolerance.tanh_roundoff("bfloat16") == 2.0**-7
    assert tolerance.tanh_roundoff("float32") == 4 * 2.0**-24
    assert tolerance.tanh_roundoff("float64") == 4 * 2.0**-53


def _half_precision_features(q, k, v, slopes, cap, dtype):
    """An honest float16/bfloat16-style evaluation: float32 scores with the scale folded
    into alpha/c, tanh rounded to the input dtype (an approximate tanh), ALiBi from
    slope / c re-multiplied, a base-2 log-sum-exp, P rounded before P @ V."""
    f32 = np.float32
    n_queries, n_keys = q.shape[-2], k.shape[-2]
    folded = f32(1 / math.sqrt(q.shape[-1])) / f32(cap)
    raw = (q.astype(f32) @ k.astype(f32).swapaxes(-1, -2)) * folded
    tanh = np.tanh(raw).astype(dtype).astype(f32)
    distance = np.abs(
        np.arange(n_queries)[:, None] + n_keys - n_queries - np.arange(n_keys)[None, :]
    ).astype(f32)
    alibi = (slopes.astype(f32)[:, None, None] / f32(cap)) * distance
    scores2 = (tanh - alibi) * f32(cap * math.log2(math.e))
    top = scores2.max(-1, keepdims=True)
    exps = np.exp2(scores2 - top)
    total = exps.sum(-1, keepdims=True)
    lse = ((top + np.log2(total)) * f32(math.log(2)))[..., 0]
    p = (exps / total).astype(dtype).astype(f32)
    return (p @ v.astype(f32)).astype(dtype), lse


@pytest.mark.parametrize("dtype", ["float16"])
def test_honest_half_precision_features_within_the_bound(dtype: str) -> None:
    """TOL-4, TOL-5: an honest half-precision evaluation (approximate tanh, folded scale,
    base-2 exponentials, P rounded) of softcap + ALiBi lies within the bound, and a bound
    without TOL-4's terms would not have covered all of it."""
    rng = np.random.default_rng(5)
    heads, n_queries, n_keys, head_dim = 4, 33, 70, 64
    q, k = (
        rng.standard_normal((heads, n, head_dim)).astype(dtype) * 3 for n in (n_queries, n_keys)
    )
    v = rng.standard_normal((heads, n_keys, 8)).astype(dtype)
    slopes = np.asarray(oracle_features.press_slopes(heads), dtype=np.float32)
    cap = 8.0
    out, lse = _half_precision_features(q, k, v, slopes, cap, dtype)
    seen = [a.astype(np.float64) for a in (q, k, v)]
    bound, lse_bound = error_and_lse_bound(
        *seen,
        dtype=dtype,
        softcap=cap,
        alibi_slopes=slopes.astype(np.float64),
        causal_alignment="bottom_right",
    )
    out_error = np.abs(out.astype(np.float64) - bound.out)
    lse_error = np.abs(lse.astype(np.float64) - lse_bound.lse)
    assert np.all(out_error <= bound.out_tolerance)
    assert np.all(lse_error <= lse_bound.lse_tolerance)
    assert np.max(lse_error / lse_bound.lse_tolerance) > 1e-3  # the bound is not vacuous


def test_base_two_lse_is_far_outside_the_bound() -> None:
    """TOL-5 against LSE-1: a log-sum-exp left in base 2 (or of unscaled scores) is
    outside the bound by orders of magnitude in float32."""
    rng = np.random.default_rng(6)
    q, k, v = (
        rng.standard_normal((2, 5, 16)),
        rng.standard_normal((2, 9, 16)),
        rng.standard_normal((2, 9, 3)),
    )
    _, bound = error_and_lse_bound(q, k, v, dtype="float32")
    base_two = bound.lse / math.log(2)
    assert np.min(np.abs(base_two - bound.lse) / bound.lse_tolerance) > 100


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_lse_bound_chunking_changes_nothing(chunk: int) -> None:
    """TOL-5: rows are independent, so the log-sum-exp and its bound evaluated in chunks
    of any size equal the whole evaluation (with an empty row, softcap and ALiBi)."""
    rng = np.random.default_rng(8)
    q, k, v = (
        rng.standard_normal((3, 6, 4)),
        rng.standard_normal((3, 5, 4)),
        rng.standard_normal((3, 5, 2)),
    )
    mask = rng.random((6, 5)) < 0.6
    mask[2] = False
    options = dict(dtype="float16", mask=mask, softcap=4.0, alibi_slopes=np.array([0.5, 0.25, 1.0]))
    _, whole = error_and_lse_bound(q, k, v, **options)
    _, parts = error_and_lse_bound(q, k, v, **options, chunk_elements=chunk)
    for name in whole._fields:
        # matrix products of different row counts may round differently in the last bit
        np.testing.assert_allclose(
            np.asarray(getattr(parts, name)),
            np.asarray(getattr(whole, name)),
            rtol=1e-12,
            err_msg=name,
        )
    assert np.all(np.asarray(whole.lse)[:, 2] == -np.inf)


def test_dropout_bound_as_displayed_and_honest_half_precision() -> None:
    """TOL-6: the displayed sum (each kept weight's TOL-2 bound plus (L_k + 2)u_a of it,
    over 1 - p, plus u_d |o| and the floor, times C where the text says) equals
    dropout_error_bound, and a float16 evaluation that rescales kept float16 weights lies
    within it."""
    text = (SPEC_DIR / "tolerance.md").read_text(encoding="utf-8")
    assert r"\xi_{ij}\Big(\tau^p_{ij} + C\,(L_k + 2)\,u_a\,p_{ij}\Big)|v_{jc}|" in text
    rng = np.random.default_rng(9)
    q, k, v = (
        rng.standard_normal(shape).astype(np.float16).astype(np.float64)
        for shape in ((2, 6, 8), (2, 9, 8), (2, 9, 3))
    )
    keep, p = rng.random((2, 6, 9)) < 0.7, 0.3
    out, tau = tolerance.dropout_error_bound(
        q, k, v, dtype="float16", dropout_p=p, dropout_keep=keep
    )
    weights = tolerance.error_bound(q, k, v, dtype="float16")
    u_a, u_d = 2.0**-24, 2.0**-11
    expected = np.zeros_like(tau)
    for h, i, c in np.ndindex(*tau.shape):
        kept = sum(
            keep[h, i, j]
            * (weights.weights_tolerance[h, i, j] + 4 * 11 * u_a * weights.weights[h, i, j])
            * abs(v[h, j, c])
            for j in range(9)
        )
        expected[h, i, c] = kept / (1 - p) + 4 * u_d * abs(out[h, i, c]) + 11 * 2.0**-24
    np.testing.assert_allclose(tau, expected, rtol=1e-12)
    # honest float16: float32 softmax, weights rounded to float16, kept ones rescaled
    f32 = np.float32
    scores = (q.astype(f32) @ k.astype(f32).swapaxes(-1, -2)) * f32(1 / math.sqrt(8))
    e = np.exp(scores - scores.max(-1, keepdims=True))
    p16 = (e / e.sum(-1, keepdims=True)).astype(np.float16).astype(f32)
    honest = ((p16 * keep * f32(1 / (1 - p))) @ v.astype(f32)).astype(np.float16)
    assert np.all(np.abs(honest.astype(np.float64) - out) <= tau)
