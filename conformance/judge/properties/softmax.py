"""SDPA-7.1, SDPA-7.4, SDPA-7.5: the softmax's consequences, its overflow safety, determinism.

Also the helpers the semantic properties share: the allowed set S(i) of a problem, the
rows a property may compare, and keeping a problem where TOL-2 is tight.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from ....reference.tolerance import (
    CHUNK_ELEMENTS,
    accumulation_roundoff,
    product_coefficient,
)
from ...call.problem import Problem
from ...draw.input_features import allowed_keys
from ...draw.realistic_values import LARGEST_FINITE, with_score_magnitude
from ...draw.strategies import draw_dtype, draw_problem
from ..assertions import assert_identical, assert_matches_reference, first_index
from ..bounds import reference_bound
from ..failures import PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import always, register
from ..reproduce import replaying
from ._helpers import (
    VALID_SCORE_ERROR,
    draw_any_problem,
    pair_score_magnitudes,
    values_per_query,
    within_validity,
)

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


def max_score_magnitude(problem: Problem) -> float:
    """max over (i, j) of |alpha| A_ij of TOL-2, over every pair (allowed or not)."""
    if problem.q.size == 0 or problem.k.size == 0:
        return 0.0
    return float(np.max(pair_score_magnitudes(problem)))


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
        chunk = allowed[..., start : start + step, :, None]  # (..., rows, Lk, 1)
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
    out = kernel.output(problem)
    allowed = allowed_keys(problem, kernel.declaration)
    low, high = allowed_value_range(allowed, values_per_query(problem))
    # TOL-2 bounds a conforming kernel's distance from the exact output, which lies in
    # [low, high]; C = 4 includes the float64 definition's own error (spec/tolerance.md).
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
            problem,
            kernel,
        )


@register("large-logits", "SDPA-7.4")
def large_logits(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Finite scores far beyond exp's range give a finite output, within TOL-2 wherever
    TOL-2 is valid: a softmax without max subtraction overflows (SDPA-7.4)."""
    dtype = draw_dtype(data, kernel)
    problem = draw_problem(
        data, kernel, dtype=dtype, bias="never", scale="never", magnitude=1.0, min_keys=1
    )
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
    out = kernel.output(large)
    if max_score_magnitude(large) > EXP_OVERFLOWS:
        _raise_if_exp_overflowed(kernel, large, out)
        _raise_if_exp_underflowed(kernel, large, out)
    assert_matches_reference(kernel, large, out, what="out with large scores (SDPA-7.4)")
    huge = with_score_magnitude(kernel, problem, HUGE_SCORE[dtype])
    out = kernel.output(huge)
    if not np.isfinite(out).all():
        _explain_overflow(kernel, problem, huge, out)


def _raise_if_exp_overflowed(kernel: KernelUnderTest, problem: Problem, out: np.ndarray) -> None:
    """A non-finite output on scores whose exp overflows but whose products q k^T do not:
    the softmax has no max subtraction (SDPA-7.4)."""
    if not np.isfinite(out).all():
        raise PropertyFailure(
            f"{_non_finite(out, problem)}, where exp overflows but q k^T does not: the "
            "softmax needs max subtraction or an equivalent [SDPA-7.4]",
            problem,
            kernel,
        )


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
            "the softmax needs max subtraction or an equivalent [SDPA-7.4]",
            problem,
            kernel,
        )


def _non_finite(out: np.ndarray, problem: Problem) -> str:
    at = first_index(~np.isfinite(out))
    return (
        f"out{at} = {out[at]!r} for finite inputs with scores up to "
        f"{max_score_magnitude(problem):.3g} ({int((~np.isfinite(out)).sum())} of "
        f"{out.size} elements not finite)"
    )


def _explain_overflow(
    kernel: KernelUnderTest, problem: Problem, huge: Problem, out: np.ndarray
) -> None:
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
    moderate_out = kernel.output(moderate)
    _raise_if_exp_overflowed(kernel, moderate, moderate_out)
    scale = 1.0 / math.sqrt(head_dim) if huge.scale is None else abs(huge.scale)
    unscaled = max_score_magnitude(huge) / scale
    if unscaled > largest:
        cause = (
            f"q k^T reaches {unscaled:.3g} before scaling, beyond {dtype}'s largest "
            f"finite value {largest:.3g}, so the kernel overflows computing the scores in "
            f"{dtype}; {dtype} scores should be accumulated in float32 (SDPA-7.2)"
        )
    else:
        cause = (
            f"an intermediate of the kernel overflows ({dtype} holds up to "
            f"{largest:.3g}), e.g. exp(s - max) because the max was taken of scores "
            "rounded differently from those exponentiated (XLA's fused multiply-add), "
            "so s - max is the scores' rounding error, not <= 0"
        )
    raise PropertyFailure(
        f"{_non_finite(out, huge)}, while scores up to {max_score_magnitude(moderate):.3g} "
        f"give a finite output, so max subtraction works: {cause} [SDPA-7.4]",
        huge,
        kernel,
    )


@register("deterministic", "SDPA-7.5", applies=always)
def deterministic(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """The same call on the same inputs twice returns identical values (and weights), for
    kernels of every family (a FAVOR+ kernel given the same seed, LIN-4.5)."""
    problem = draw_any_problem(data, kernel)
    first, second = kernel.call_on(problem), kernel.call_on(problem)
    for what, a, b in (("out", first[0], second[0]), ("weights", first[1], second[1])):
        if a is not None:
            # the reproduction replays the second call and compares outputs (weights too
            # when only they differ: it prints how far the outputs are apart)
            with replaying([("again", problem)], "out_again"):
                assert_identical(
                    kernel.numpy(b),
                    kernel.numpy(a),
                    f"{what} of a second call (SDPA-7.5)",
                    problem,
                    kernel,
                )
