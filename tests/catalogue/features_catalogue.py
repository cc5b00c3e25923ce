"""Catalogue entries for the feature bugs (spec/features.md, DROP-2 … DROP-4).

Each entry names the property that must catch the bug and carries its own evidence that
the bug is real, computed from the reference and plain NumPy on a fixed input, not by the
property: an output or log-sum-exp outside its bound, a wrong dtype, indicators with the
wrong frequency or shared where they must be independent, a seed that reproduces nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnspec.backends import Backend
from attnspec.conformance.kernel import KernelUnderTest, Problem
from attnspec.conformance.oracle import lse_bound, reference_bound

from . import bugs_features as bugs
from .feature_blocks import press_slopes

Evidence = Callable[[KernelUnderTest], str | None]


@dataclass(frozen=True)
class FeatureBug:
    """A catalogue entry like ``BuggyKernel``, with evidence instead of a dense witness."""

    name: str
    fn: Callable[..., Any]
    catches: str
    evidence: Evidence
    backend: str = "numpy"
    witness: None = None
    known_miss: str = ""

    def observed_difference(self) -> str | None:
        return self.evidence(KernelUnderTest(self.fn, Backend(self.backend)))


def _problem(seed: int = 0, *, heads: tuple[int, int] = (4, 2), n_queries: int = 5,
             n_keys: int = 7, magnitude: float = 1.0, dtype: str = "float64",
             **fields: Any) -> Problem:
    rng = np.random.default_rng(seed)
    n_q, n_kv = heads
    return Problem(q=rng.standard_normal((2, n_q, n_queries, 6)) * magnitude,
                   k=rng.standard_normal((2, n_kv, n_keys, 6)) * magnitude,
                   v=rng.standard_normal((2, n_kv, n_keys, 3)), dtype=dtype, **fields)


def _outside(actual: np.ndarray, expected: np.ndarray, tolerance: np.ndarray,
             what: str) -> str | None:
    if actual.shape != expected.shape:
        return f"{what} has shape {actual.shape}, the definition's is {expected.shape}"
    same = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
    with np.errstate(invalid="ignore"):
        bad = ~same & ~(np.abs(actual - expected) <= tolerance)
    if not bad.any():
        return None
    at = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"{what}{at} = {float(actual[at])!r}, the definition's is {float(expected[at])!r} "
            f"(bound {float(tolerance[at]):.3g})")


def out_differs(problem: Problem) -> Evidence:
    """Evidence: the output departs from the definition (with features) beyond TOL-2."""
    def evidence(kernel: KernelUnderTest) -> str | None:
        bound = reference_bound(problem, kernel.declaration)
        return _outside(kernel.run(problem), np.asarray(bound.out),
                        np.asarray(bound.out_tolerance), "out")
    return evidence


def lse_differs(problem: Problem) -> Evidence:
    """Evidence: the log-sum-exp departs from LSE-1 beyond TOL-5, or is not float32."""
    def evidence(kernel: KernelUnderTest) -> str | None:
        _, lse, dtype = kernel.run_with_lse(problem)
        wanted = "float64" if problem.dtype == "float64" else "float32"
        if dtype != wanted:
            return f"lse.dtype={dtype} for {problem.dtype} inputs"
        _, bound = lse_bound(problem, kernel.declaration)
        return _outside(lse, np.asarray(bound.lse), np.asarray(bound.lse_tolerance), "lse")
    return evidence


def _observed(kernel: KernelUnderTest, p: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """q = 0, V = I, (2, 4, 64, 64): the output (kept, rescaled weights) and its support."""
    q = np.zeros((2, 4, 64, 4))
    problem = Problem(q=q, k=q, v=np.broadcast_to(np.eye(64), (2, 4, 64, 64)).copy(),
                      dtype="float64", dropout_p=p, seed=seed)
    out = kernel.run(problem)
    return out, out > 0


def kept_values_wrong(kernel: KernelUnderTest) -> str | None:
    """Evidence: kept entries are not 1/(Lk (1 - p)) (the uniform weight, rescaled)."""
    out, kept = _observed(kernel, 0.3, 1)
    values = np.unique(np.round(out[kept], 12))
    want = 1 / (64 * 0.7)
    if values.size == 1 and math.isclose(values[0], want, rel_tol=1e-9):
        return None
    return f"kept entries take the values {values[:4]}, DROP-2 gives only {want:.6g}"


def kept_fraction_wrong(kernel: KernelUnderTest) -> str | None:
    """Evidence: the kept fraction of 32768 indicators is far from 1 - p = 0.7."""
    _, kept = _observed(kernel, 0.3, 2)
    return None if abs(kept.mean() - 0.7) < 0.05 else (
        f"kept {kept.mean():.3f} of {kept.size} weights with p = 0.3")


def shared_indicators(axis: int) -> Evidence:
    """Evidence: indicators along ``axis`` are identical, which independent ones of 64
    entries each are with probability (0.7^2 + 0.3^2)^64 < 1e-12."""
    def evidence(kernel: KernelUnderTest) -> str | None:
        _, kept = _observed(kernel, 0.3, 3)
        first, second = np.take(kept, 0, axis=axis), np.take(kept, 1, axis=axis)
        return (f"indicators 0 and 1 along axis {axis} are identical"
                if np.array_equal(first, second) else None)
    return evidence


def seed_ignored(kernel: KernelUnderTest) -> str | None:
    """Evidence: two calls with the same seed draw different indicators."""
    first, second = (_observed(kernel, 0.3, 4)[1] for _ in range(2))
    return None if np.array_equal(first, second) else "the same seed gave different masks"


def _masked(problem: Problem) -> Problem:
    mask = np.random.default_rng(9).random((*problem.q.shape[:-1], problem.k.shape[-2])) < 0.5
    mask[..., 0] = True
    return problem.with_(mask=mask)


SLOPES = press_slopes(4).astype(np.float64)
FEATURE_CATALOGUE: list[FeatureBug] = [
    FeatureBug("softcap-before-scale", bugs.softcap_before_scale, "softcap-matches-reference",
               out_differs(_problem(magnitude=3.0, softcap=2.0))),
    FeatureBug("softcap-bias-inside", bugs.softcap_bias_inside, "softcap-matches-reference",
               out_differs(_problem(softcap=1.0, bias=np.random.default_rng(5).standard_normal(
                   (2, 4, 5, 7)) * 3))),
    FeatureBug("softcap-mask-inside", bugs.softcap_mask_inside, "softcap-matches-reference",
               out_differs(_masked(_problem(magnitude=3.0, softcap=1.0)))),
    FeatureBug("softcap-ignored", bugs.softcap_ignored, "softcap-bounds-logits",
               out_differs(_problem(magnitude=3.0, softcap=2.0))),
    FeatureBug("alibi-wrong-corner", bugs.alibi_wrong_corner, "alibi-matches-reference",
               out_differs(_problem(alibi_slopes=SLOPES, n_queries=3, n_keys=7))),
    FeatureBug("alibi-positive-sign", bugs.alibi_positive_sign, "alibi-matches-reference",
               out_differs(_problem(alibi_slopes=SLOPES))),
    FeatureBug("alibi-kv-head-slopes", bugs.alibi_kv_head_slopes, "alibi-matches-reference",
               out_differs(_problem(alibi_slopes=SLOPES))),
    FeatureBug("alibi-scaled", bugs.alibi_scaled, "alibi-matches-reference",
               out_differs(_problem(alibi_slopes=SLOPES))),
    FeatureBug("alibi-naive-slopes", bugs.alibi_naive_slopes, "alibi-standard-slopes",
               out_differs(_problem(heads=(6, 6), alibi_slopes=press_slopes(6).astype(
                   np.float64)))),
    FeatureBug("lse-base-two", bugs.lse_base_two, "lse-matches-reference",
               lse_differs(_problem())),
    FeatureBug("lse-unscaled-max", bugs.lse_unscaled_max, "lse-matches-reference",
               lse_differs(_problem(magnitude=2.0))),
    FeatureBug("lse-plus-inf-empty", bugs.lse_plus_inf_empty, "lse-empty-rows",
               lse_differs(_problem(n_keys=0))),
    FeatureBug("lse-zero-empty", bugs.lse_zero_empty, "lse-empty-rows",
               lse_differs(_problem(n_keys=0))),
    FeatureBug("lse-input-dtype", bugs.lse_input_dtype, "lse-dtype",
               lse_differs(_problem(dtype="float16"))),
    FeatureBug("lse-without-softcap", bugs.lse_without_softcap, "lse-matches-reference",
               lse_differs(_problem(magnitude=3.0, softcap=1.0))),
    FeatureBug("dropout-no-rescale", bugs.dropout_no_rescale, "dropout-rescaling",
               kept_values_wrong),
    FeatureBug("dropout-times-keep-probability", bugs.dropout_times_keep_probability,
               "dropout-unbiased", kept_values_wrong),
    FeatureBug("dropout-renormalised", bugs.dropout_renormalised, "dropout-rescaling",
               kept_values_wrong),
    FeatureBug("dropout-keeps-with-p", bugs.dropout_keeps_with_p, "dropout-kept-fraction",
               kept_fraction_wrong),
    FeatureBug("dropout-shared-by-heads", bugs.dropout_shared_by_heads,
               "dropout-independence", shared_indicators(axis=1)),
    FeatureBug("dropout-per-key", bugs.dropout_per_key, "dropout-independence",
               shared_indicators(axis=2)),
    FeatureBug("dropout-ignores-seed", bugs.dropout_ignores_seed, "dropout-seed", seed_ignored),
]
