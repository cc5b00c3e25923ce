"""SDPA-7.1, SDPA-7.4, SDPA-7.5: the softmax's consequences, its overflow safety, determinism.

Also the helpers the semantic properties share: the allowed set S(i) of a problem, the
rows a property may compare, and keeping a problem where TOL-2 is tight.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from ...reference.tolerance import (
    CHUNK_ELEMENTS,
    accumulation_roundoff,
    error_bound,
    product_coefficient,
)
from ..assertions import assert_identical, assert_matches_reference, first_index
from ..declaration import KernelDeclaration
from ..failures import PropertyFailure
from ..input_features import allowed_keys, scores_shape
from ..kernel import KernelUnderTest, Problem
from ..oracle import reference_bound
from ..registry import always, register
from ..strategies import draw_any_problem, draw_dtype, draw_problem
from ..values import LARGEST_FINITE, with_score_magnitude

# TOL-2 holds for every score error, but grows like 1/(1 - D_i): beyond D_i = 1/4 a
# comparison can catch little, so value comparisons keep problems below it.
VALID_SCORE_ERROR = 0.25

# SDPA-7.4: the largest |scaled score| whose scores, and differences of two scores, stay
# finite in the dtype a kernel may hold them in.  float16 kernels may keep scores in
# float16 (max 65504; the unscaled product is up to sqrt(E) <= 2.9 times larger, the
# difference of two scores twice larger); bfloat16 has float32's range.
# half precision scores are accumulated in float32 (SDPA-7.2), so they may exceed 65504
HUGE_SCORE = {"float16": 1e6, "bfloat16": 1e30, "float32": 1e30, "float64": 1e300}
EXP_OVERFLOWS = 89.0  # exp(s) is inf in float32 (and so in float16, bfloat16) beyond this
# Scores whose exp overflows every dtype (float64's beyond 710) and whose rounding error
# (|s| u, 6e-4 in float32) is far below exp's range: a kernel failing here lacks max subtraction
MODERATE_SCORE = 1e4


def _group_heads(problem: Problem, a: np.ndarray) -> np.ndarray:
    """A key-side array ``(..., Hkv, Lk, ·)`` repeated per query head: head h uses h // G."""
    groups = problem.q.shape[-3] // problem.k.shape[-3]
    return np.repeat(a, groups, axis=-3)


def compared_rows(problem: Problem, declaration: KernelDeclaration) -> np.ndarray:
    """``(*batch, Hq, Lq, 1)``: rows whose output the spec fixes for this kernel.

    A row with no allowed key outputs 0 (SDPA-5.1) only for a kernel claiming that rule;
    for any other kernel its output is not compared.
    """
    allowed = allowed_keys(problem, declaration)
    rows = allowed.any(axis=-1, keepdims=True)
    return np.ones_like(rows) if declaration.empty_rows_zero else rows


def pair_score_magnitudes(problem: Problem) -> np.ndarray:
    """|alpha| A_ij of TOL-2 for every pair (allowed or not), ``(..., Hq, Lq, Lk)``."""
    head_dim, n_kv = problem.q.shape[-1], problem.k.shape[-3]
    scale = 1.0 / math.sqrt(head_dim) if problem.scale is None else abs(problem.scale)
    keys = np.repeat(np.abs(problem.k), problem.q.shape[-3] // max(n_kv, 1), axis=-3)
    return scale * (np.abs(problem.q) @ np.swapaxes(keys, -1, -2))


def max_score_magnitude(problem: Problem) -> float:
    """max over (i, j) of |alpha| A_ij of TOL-2, over every pair (allowed or not)."""
    if problem.q.size == 0 or problem.k.size == 0:
        return 0.0
    return float(np.max(pair_score_magnitudes(problem)))


def row_score_errors(problem: Problem, declaration: KernelDeclaration | None = None) -> np.ndarray:
    """D_i of TOL-2 for every query row of ``problem`` (0 for rows with no allowed key)."""
    alignment = "top_left" if declaration is None else declaration.causal_alignment
    return np.asarray(error_bound(
        problem.q, problem.k, problem.v, dtype=problem.dtype, mask=problem.mask,
        bias=problem.bias, is_causal=problem.is_causal, causal_alignment=alignment,
        scale=problem.scale, weights=False,
    ).score_error)


def score_error(problem: Problem) -> float:
    """max_i D_i of TOL-2: how far the score errors a kernel may make can move a row's
    weights (relative, weighted by the weights themselves)."""
    errors = row_score_errors(problem)
    return float(np.max(errors)) if errors.size else 0.0


def within_validity(kernel: KernelUnderTest, problem: Problem) -> Problem:
    """``problem`` with q scaled by a power of two until D_i <= 1/4 (TOL-2 tight).

    Properties that compare values within TOL-2 use this, so that the bound stays tight
    enough to catch errors (it holds for any D, spec/tolerance.md).  Rows whose bias alone
    puts them beyond 1/4 (every key padded with a huge finite bias: their weights are not
    determined by the arithmetic SDPA-7.2 allows) keep TOL-2's hull bound and are left out
    of the target.
    """
    errors = row_score_errors(problem, kernel.declaration)
    if errors.size == 0 or np.max(errors) <= VALID_SCORE_ERROR:
        return problem
    unscaled = problem.with_(q=np.zeros_like(problem.q))
    reachable = row_score_errors(unscaled, kernel.declaration) < VALID_SCORE_ERROR
    if not np.any(reachable & (errors > VALID_SCORE_ERROR)):
        return problem
    scaled = problem
    for halvings in range(1, 2100):  # a float64 q underflows to 0 within 1100 halvings
        q = kernel.rounded(problem.q * 2.0**-halvings, problem.dtype)
        scaled = problem.with_(q=q)
        errors = row_score_errors(scaled, kernel.declaration)
        if np.all(errors[reachable] <= VALID_SCORE_ERROR):
            return scaled
    return scaled


def values_per_query(problem: Problem) -> np.ndarray:
    """V broadcast to ``(*batch, Hq, Lk, Ev)``: the values each query head attends."""
    v = _group_heads(problem, problem.v)
    shape = scores_shape(problem)
    return np.broadcast_to(v, (*shape[:-2], *v.shape[-2:]))


def allowed_value_range(allowed: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per output element ``(..., Lq, Ev)``, the min and max of its V column over the
    allowed keys (+inf and -inf for a row with none), from ``allowed`` ``(..., Lq, Lk)``
    and ``v`` ``(..., Lk, Ev)``; in chunks of query rows, so that the ``(rows, Lk, Ev)``
    temporaries stay as small as TOL-2's own chunks (a 4096-key problem fits in memory)."""
    n_queries, n_keys = allowed.shape[-2:]
    per_row = math.prod(allowed.shape[:-2]) * n_keys * v.shape[-1]
    step = max(1, CHUNK_ELEMENTS // max(1, per_row))
    lows, highs = [], []
    for start in range(0, n_queries, step):
        chunk = allowed[..., start:start + step, :, None]  # (..., rows, Lk, 1)
        lows.append(np.where(chunk, v[..., None, :, :], np.inf).min(axis=-2, initial=np.inf))
        highs.append(np.where(chunk, v[..., None, :, :], -np.inf).max(axis=-2, initial=-np.inf))
    if not lows:
        empty = np.zeros((*allowed.shape[:-1], v.shape[-1]))
        return empty, empty
    return np.concatenate(lows, axis=-2), np.concatenate(highs, axis=-2)


@register("output-in-value-hull", "SDPA-7.1")
def output_in_value_hull(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Each output element lies between the min and max of its V column over the allowed
    keys S(i), widened by TOL-2: the weights are a convex combination (SDPA-7.1)."""
    problem = within_validity(kernel, draw_problem(data, kernel, min_keys=1))
    out = kernel.run(problem)
    allowed = allowed_keys(problem, kernel.declaration)
    low, high = allowed_value_range(allowed, values_per_query(problem))
    # TOL-2 bounds a conforming kernel's distance from the exact output, which lies in
    # [low, high]; C = 4 includes the float64 oracle's own error (spec/tolerance.md).
    tolerance = np.asarray(reference_bound(problem, kernel.declaration).out_tolerance)
    rows = allowed.any(axis=-1, keepdims=True)  # rows with no key are SDPA-5.1's business
    inside = (out >= low - tolerance) & (out <= high + tolerance)
    outside = rows & ~inside
    if outside.any():
        at = first_index(outside)
        raise PropertyFailure(
            f"out{at} = {out[at]!r} lies outside [{low[at]!r}, {high[at]!r}], the range of "
            f"its V column over the allowed keys, by more than the TOL-2 bound "
            f"{tolerance[at]:.3g} ({int(outside.sum())} of {outside.size} elements) [SDPA-7.1]",
            problem, kernel,
        )


@register("large-logits", "SDPA-7.4")
def large_logits(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Finite scores far beyond exp's range give a finite output, within TOL-2 wherever
    TOL-2 is valid: a softmax without max subtraction overflows (SDPA-7.4)."""
    dtype = draw_dtype(data, kernel)
    problem = draw_problem(data, kernel, dtype=dtype, bias="never", scale="never",
                           magnitude=1.0, min_keys=1)
    u_a = accumulation_roundoff(dtype)
    # About the largest scores for which TOL-2 stays tight: every Delta_ij <= ln(5/4), so
    # D_i <= 1/4 (spec/tolerance.md; the gap term is at most 2 max|alpha| A_ij).  In float32
    # that is ~2e5, in float64 ~1e14: exp overflows far below either.
    coefficient = product_coefficient(dtype, problem.q.shape[-1], problem.scale) + 6 * u_a
    valid = 0.9 * (math.log(1 + VALID_SCORE_ERROR) - 4 * u_a) / coefficient
    # ... and no larger than a quarter of the dtype's range, so that q k^T formed in the
    # dtype stays finite here too (the huge problem below tells that overflow apart)
    valid = min(valid, LARGEST_FINITE[dtype] / 4)
    large = within_validity(kernel, with_score_magnitude(kernel, problem, valid))
    out = kernel.run(large)
    if max_score_magnitude(large) > EXP_OVERFLOWS:
        if not np.isfinite(out).all():
            raise PropertyFailure(
                f"{_non_finite(out, large)}, where exp overflows but q k^T does not: the "
                "softmax needs max subtraction or an equivalent [SDPA-7.4]", large, kernel,
            )
        _raise_if_exp_underflowed(kernel, large, out)
    assert_matches_reference(kernel, large, out, what="out with large scores (SDPA-7.4)")
    huge = with_score_magnitude(kernel, problem, HUGE_SCORE[dtype])
    out = kernel.run(huge)
    if not np.isfinite(out).all():
        _explain_overflow(kernel, problem, huge, out)


def _raise_if_exp_underflowed(kernel: KernelUnderTest, problem: Problem, out: np.ndarray) -> None:
    """Rows the kernel zeroes where the definition is not 0, on scores beyond exp's range:
    every exp(s) underflowed, which max subtraction prevents (SDPA-7.4)."""
    expected = np.asarray(reference_bound(problem, kernel.declaration).out)
    if out.shape != expected.shape:
        return
    zeroed = np.all(out == 0, axis=-1) & np.any(expected != 0, axis=-1)
    if zeroed.any():
        at = first_index(zeroed)
        raise PropertyFailure(
            f"out{at} is all 0, but should be {expected[at]!r}, for scores up to "
            f"{max_score_magnitude(problem):.3g}, where exp underflows but q k^T does not: "
            "the softmax needs max subtraction or an equivalent [SDPA-7.4]", problem, kernel,
        )


def _non_finite(out: np.ndarray, problem: Problem) -> str:
    at = first_index(~np.isfinite(out))
    return (f"out{at} = {out[at]!r} for finite inputs with scores up to "
            f"{max_score_magnitude(problem):.3g} ({int((~np.isfinite(out)).sum())} of "
            f"{out.size} elements not finite)")


def _explain_overflow(kernel: KernelUnderTest, problem: Problem, huge: Problem,
                      out: np.ndarray) -> None:
    """Say which overflow a non-finite output on ``huge`` comes from (SDPA-7.4, SDPA-7.2).

    Scores whose exp overflows every dtype (> 1000) but whose unscaled products stay far
    inside the dtype's range tell the two apart: a kernel that fails there has no max
    subtraction; one that passes there but fails on ``huge`` overflows in q k^T itself or in
    an intermediate such as s - max (docs/divergences.md#jax-jit-large-scores).
    """
    dtype, head_dim = problem.dtype, problem.q.shape[-1]
    largest = LARGEST_FINITE[dtype]
    moderate_limit = min(MODERATE_SCORE, largest / (4 * math.sqrt(head_dim)))
    moderate = with_score_magnitude(kernel, problem, moderate_limit)
    moderate_out = kernel.run(moderate)
    if not np.isfinite(moderate_out).all():
        raise PropertyFailure(
            f"{_non_finite(moderate_out, moderate)}, where exp overflows but q k^T does not: "
            "the softmax needs max subtraction or an equivalent [SDPA-7.4]",
            moderate, kernel,
        )
    scale = 1.0 / math.sqrt(head_dim) if huge.scale is None else abs(huge.scale)
    unscaled = max_score_magnitude(huge) / scale
    if unscaled > largest:
        cause = (f"q k^T reaches {unscaled:.3g} before scaling, beyond {dtype}'s largest "
                 f"finite value {largest:.3g}, so the kernel overflows computing the scores in "
                 f"{dtype}; {dtype} scores should be accumulated in float32 (SDPA-7.2)")
    else:
        cause = (f"an intermediate of the kernel overflows ({dtype} holds up to "
                 f"{largest:.3g}), e.g. exp(s - max) because the max was taken of scores "
                 "rounded differently from those exponentiated (XLA's fused multiply-add), "
                 "so s - max is the scores' rounding error, not <= 0")
    raise PropertyFailure(
        f"{_non_finite(out, huge)}, while scores up to {max_score_magnitude(moderate):.3g} "
        f"give a finite output, so max subtraction works: {cause} [SDPA-7.4]",
        huge, kernel,
    )


@register("deterministic", "SDPA-7.5", applies=always)
def deterministic(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """The same call on the same inputs twice returns identical values (and weights), for
    kernels of every family (a FAVOR+ kernel given the same seed, LIN-4.5)."""
    problem = draw_any_problem(data, kernel)
    first, second = kernel.invoke(problem), kernel.invoke(problem)
    for what, a, b in (("out", first[0], second[0]), ("weights", first[1], second[1])):
        if a is not None:
            assert_identical(kernel.numpy(b), kernel.numpy(a), f"{what} of a second call "
                             "(SDPA-7.5)", problem, kernel)
