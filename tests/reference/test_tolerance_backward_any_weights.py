"""BWD-17's second bound: a float32 row whose allowed keys all carry a bias of -1e9 may have
any weights over S(i) (float32 rounds -1e9 + s to -1e9 for |s| < 32), and the bound holds
for every such kernel (issue 31): FlashAttention 2's backward (the catalogue's ``flash2``,
which failed quick seeds 1, 7, 8, 9, 13, 19 before) and float64 gradients computed from
adversarial weights (all on one key, uniform, every weight 1), checked against a plain NumPy oracle.
On rows whose allowed keys all carry float32's finfo.min, the second bound alone is charged,
as a float64 loop evaluates its formula, and jax.nn's weights on the excluded keys exceed it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from attnspec.reference.tolerance_backward import gradient_error_bound

# (queries, keys, dim, softcap, seed): seed 7's shape (one query, 257 keys, softcap 5), and
# three query rows without a softcap
PROBLEMS = ((1, 257, 8, 5.0, 7), (3, 40, 4, None, 1))
PADDING = -1e9


def _problem(n_queries: int, n_keys: int, dim: int, seed: int) -> dict[str, Any]:
    """float32-representable inputs in float64, every key biased by -1e9."""
    rng = np.random.default_rng(seed)
    f32 = [rng.standard_normal((1, 1, n, dim)).astype(np.float32) for n in (n_queries, n_keys)]
    v, do = (rng.standard_normal((1, 1, n, dim)).astype(np.float32) for n in (n_keys, n_queries))
    bias = np.full((1, 1, n_queries, n_keys), PADDING, dtype=np.float32)
    return {"q": f32[0], "k": f32[1], "v": v, "grad_out": do, "bias": bias}


def _bound(problem: dict[str, Any], softcap: float | None, mask: Any = None) -> Any:
    f64 = {name: a.astype(np.float64) for name, a in problem.items()}
    return gradient_error_bound(
        f64["q"],
        f64["k"],
        f64["v"],
        f64["grad_out"],
        dtype="float32",
        bias=f64["bias"],
        softcap=softcap,
        mask=mask,
    )


def _with_weights(problem: dict[str, Any], weights: Any, softcap: float | None) -> tuple[Any, ...]:
    """The oracle: BWD-1's gradients in float64 loops, with the given weights per row."""
    q, k, v, do = (problem[n][0, 0].astype(np.float64) for n in ("q", "k", "v", "grad_out"))
    alpha = 1 / math.sqrt(q.shape[-1])
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    db = np.zeros((q.shape[0], k.shape[0]))
    for i in range(q.shape[0]):
        dp = [float(do[i] @ v[j]) for j in range(k.shape[0])]
        delta = sum(weights[i][j] * dp[j] for j in range(k.shape[0]))
        for j in range(k.shape[0]):
            ds = weights[i][j] * (dp[j] - delta)
            dx = ds
            if softcap is not None:
                dx = ds * (1 - math.tanh(alpha * float(q[i] @ k[j]) / softcap) ** 2)
            dq[i] += alpha * dx * k[j]
            dk[j] += alpha * dx * q[i]
            dv[j] += weights[i][j] * do[i]
            db[i, j] = ds
    return dq, dk, dv, db


def _within(got: tuple[Any, ...], bound: Any) -> list[bool]:
    pairs = zip(
        got,
        (bound.dq, bound.dk, bound.dv, bound.dbias),
        (bound.dq_tolerance, bound.dk_tolerance, bound.dv_tolerance, bound.dbias_tolerance),
        strict=True,
    )
    return [
        bool(np.all(np.abs(np.reshape(g, np.shape(ref)) - ref) <= tol)) for g, ref, tol in pairs
    ]


@pytest.mark.parametrize("shape", PROBLEMS, ids=lambda s: f"Lq{s[0]}-Lk{s[1]}-seed{s[4]}")
def test_any_weights_over_the_row_are_within_the_bound(shape: tuple[Any, ...]) -> None:
    """BWD-17: where the weights are undetermined, gradients from all weight on one key (the
    first, the last), uniform weights, or every weight 1 (exp(s - lse) where float32 rounds
    every score and the log-sum-exp to -1e9, as flash2 computes) are within the bound; the
    first-order bound alone fails the last."""
    n_queries, n_keys, dim, softcap, seed = shape
    problem = _problem(n_queries, n_keys, dim, seed)
    bound = _bound(problem, softcap)
    for weights in (np.eye(n_keys)[[0] * n_queries], np.eye(n_keys)[[-1] * n_queries]):
        assert _within(_with_weights(problem, weights, softcap), bound) == [True] * 4
    uniform = np.full((n_queries, n_keys), 1 / n_keys)
    ones = np.ones((n_queries, n_keys))
    assert _within(_with_weights(problem, ones, softcap), bound) == [True] * 4
    assert _within(_with_weights(problem, uniform, softcap), bound) == [True] * 4


@pytest.mark.parametrize("shape", PROBLEMS, ids=lambda s: f"Lq{s[0]}-Lk{s[1]}-seed{s[4]}")
def test_flash2_is_within_the_bound_on_undetermined_rows(shape: tuple[Any, ...]) -> None:
    """BWD-17: the catalogue's correct FlashAttention 2 backward in float32 (issue 31)."""
    torch = pytest.importorskip("torch", reason="the catalogue's flash2 is written in torch")
    from tests.catalogue.backward import flash2_backward

    n_queries, n_keys, dim, softcap, seed = shape
    problem = _problem(n_queries, n_keys, dim, seed)
    tensors = {name: torch.from_numpy(a) for name, a in problem.items()}
    got = flash2_backward(
        tensors["q"],
        tensors["k"],
        tensors["v"],
        tensors["grad_out"],
        bias=tensors["bias"],
        softcap=softcap,
    )
    assert _within(tuple(g.double().numpy() for g in got), _bound(problem, softcap)) == [True] * 4


def test_the_second_bound_is_the_same_on_array_api_strict() -> None:
    """BWD-17's second bound is pure Array API: array-api-strict gives NumPy's numbers."""
    strict = pytest.importorskip("array_api_strict", reason="the strict namespace checks purity")
    problem = _problem(2, 33, 4, 3)
    f64 = {name: a.astype(np.float64) for name, a in problem.items()}
    by_numpy = _bound(problem, 5.0)
    by_strict = gradient_error_bound(
        *(strict.asarray(f64[n]) for n in ("q", "k", "v", "grad_out")),
        dtype="float32",
        bias=strict.asarray(f64["bias"]),
        softcap=5.0,
    )
    for mine, theirs in zip(by_numpy, by_strict, strict=True):
        np.testing.assert_allclose(np.asarray(theirs), mine, rtol=1e-12, atol=0)


F32_MIN = float(np.finfo(np.float32).min)
# S(i) of the finfo.min problem: causal, with one key more than queries (bottom-right), so
# the last key is attended by the last row only, as key 63 of the padded anchor of the
# write-up; every other row has excluded keys
MASK = np.tril(np.ones((4, 5), dtype=bool), k=1)


def _min_biased_problem() -> dict[str, Any]:
    """float32 inputs whose every score carries float32's finfo.min (float32 rounds s +
    finfo.min to finfo.min), a mask excluding some keys of every row."""
    n_queries, n_keys = MASK.shape
    problem = _problem(n_queries, n_keys, 3, 0)
    problem["bias"] = np.full((1, 1, n_queries, n_keys), F32_MIN, dtype=np.float32)
    return problem


def _second_bound_oracle(problem: dict[str, Any]) -> tuple[Any, ...]:
    """BWD-17's tolerances of a float32 problem whose every row is undetermined, from the
    spec's formulas in float64 loops: the second bound alone (chi, rho, Sigma), with the
    definition's weights (a float64 softmax with its row's largest score subtracted)."""
    q, k, v, do = (problem[n][0, 0].astype(np.float64) for n in ("q", "k", "v", "grad_out"))
    bias = problem["bias"][0, 0].astype(np.float64)
    u, sigma, safety = 2.0**-24, 2.0**-126, 4.0  # TOL-2's u_d = u_a, sigma_d and C, float32
    (n_queries, dim), n_keys = q.shape, k.shape[0]
    alpha = 1 / math.sqrt(dim)
    eps_q, eps_k, eps_v = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    eps_b, db = np.zeros((n_queries, n_keys)), np.zeros((n_queries, n_keys))
    for i in range(n_queries):
        keys = [j for j in range(n_keys) if MASK[i, j]]
        scores = {j: alpha * float(q[i] @ k[j]) + bias[i, j] for j in keys}
        top = max(scores.values())
        total = sum(math.exp(s - top) for s in scores.values())
        p = {j: math.exp(scores[j] - top) / total for j in keys}
        dp = {j: float(do[i] @ v[j]) for j in keys}
        delta = sum(p[j] * dp[j] for j in keys)
        rho = ((2 * dim + 2 * n_keys + 6) * u + 3 * u) * sum(
            float(np.abs(do[i]) @ np.abs(v[j])) for j in keys
        )
        span = max(abs(dp[j]) for j in keys) + sum(abs(dp[j]) for j in keys) + rho
        for j in keys:
            ds = p[j] * (dp[j] - delta)
            dq[i] += alpha * ds * k[j]
            dk[j] += alpha * ds * q[i]
            dv[j] += p[j] * do[i]
            db[i, j] = ds
            eps_q[i] += alpha * (span + abs(ds)) * np.abs(k[j])
            eps_k[j] += alpha * (span + abs(ds)) * np.abs(q[i])
            eps_v[j] += np.abs(do[i])
            eps_b[i, j] = span + abs(ds)

    def tolerance(eps: Any, grad: Any, terms: int) -> Any:
        return safety * (eps + u * np.abs(grad)) + (terms + 2) * sigma

    return (
        tolerance(eps_q, dq, n_keys),
        tolerance(eps_k, dk, n_queries),
        tolerance(eps_v, dv, n_queries),
        tolerance(eps_b, db, 1),
    )


def test_a_row_padded_with_finfo_min_is_charged_the_second_bound_alone() -> None:
    """BWD-17: on a float32 row whose allowed keys all carry finfo.min (undetermined), the
    row's part of every gradient's bound is the second bound in place of its first-order
    terms, which charge the rounding of s + finfo.min (near 1e31) and would allow any
    gradient: the reference's tolerances equal the formula's, evaluated in float64 loops."""
    problem = _min_biased_problem()
    bound = _bound(problem, None, MASK)
    got = (bound.dq_tolerance, bound.dk_tolerance, bound.dv_tolerance, bound.dbias_tolerance)
    for mine, expected in zip(got, _second_bound_oracle(problem), strict=True):
        np.testing.assert_allclose(np.reshape(mine, expected.shape), expected, rtol=1e-12)


def test_weights_given_to_excluded_keys_exceed_the_bound() -> None:
    """BWD-3, BWD-17: jax.nn's divergence (docs/divergences.md#jax-fill-outranks-min-bias),
    a row whose allowed keys all carry finfo.min giving its weight evenly to its excluded
    keys, puts dv on a key outside those rows' S(i) beyond the bound (before 2026-12-07 the
    last row's first-order terms, near 1e31, allowed it); every weight 1 over S(i) (flash2's
    there) stays within it."""
    problem = _min_biased_problem()
    bound = _bound(problem, None, MASK)
    # jax.nn's weights: even over the excluded keys, or over S(i) in a row without any
    excluded = np.sum(~MASK, axis=-1, keepdims=True)
    spread = np.where(
        excluded > 0, ~MASK / np.maximum(excluded, 1), MASK / np.sum(MASK, -1)[:, None]
    )
    dv = _with_weights(problem, spread, None)[2]
    beyond = np.abs(dv - bound.dv[0, 0]) > bound.dv_tolerance[0, 0]
    assert np.any(beyond[-1]), "the key only the last row may attend"
    within = _with_weights(problem, MASK.astype(np.float64), None)
    # the excluded pairs' dS is the oracle's, not a kernel's: those pairs have no bias gradient
    within = (*within[:3], np.where(MASK, within[3], 0.0))
    assert _within(within, bound) == [True] * 4
