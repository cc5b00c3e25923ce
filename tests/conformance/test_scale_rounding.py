"""TOL-2's scale term (erratum E-2026.12-14): the bound of the same scaled scores does not
depend on the head dim, so a kernel whose scores pass through float16 is judged alike at
E = 16, 64, 128 and 256 (issue 38: it failed at 16 and 256 and passed at 64 and 128)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from catalogue.bugs_diagnosis import scores_accumulated_in_float16, scores_cast_to_float16
from catalogue.correct import lse_attention

from attnspec.conformance.call.problem import Problem
from attnspec.conformance.claims.declaration import declaration_of
from attnspec.conformance.judge.bounds import reference_bound
from attnspec.reference.tolerance import UNIT_ROUNDOFF, product_coefficient

HEAD_DIMS = (16, 64, 128, 256)


def _error_ratio(fn: Callable[..., Any], head_dim: int) -> float:
    """The kernel's largest error over its TOL-2 bound on float16 inputs whose scaled
    scores q . k / sqrt(E) are drawn alike at every head dim (about N(0, 4))."""
    rng = np.random.default_rng(head_dim)
    q = (rng.standard_normal((2, 4, 6, head_dim)) * 2 / head_dim**0.25).astype(np.float16)
    k = (rng.standard_normal((2, 4, 64, head_dim)) * head_dim**0.25).astype(np.float16)
    v = rng.standard_normal((2, 4, 64, 8)).astype(np.float16)
    out = fn(q, k, v).astype(np.float64)
    problem = Problem(q=q.astype(float), k=k.astype(float), v=v.astype(float), dtype="float16")
    bound = reference_bound(problem, declaration_of(fn))
    return float(np.max(np.abs(out - np.asarray(bound.out)) / np.asarray(bound.out_tolerance)))


@pytest.mark.parametrize("fn", [scores_cast_to_float16, scores_accumulated_in_float16])
def test_float16_scores_are_judged_alike_at_every_head_dim(fn: Callable[..., Any]) -> None:
    """TOL-2 (E-2026.12-14): a kernel keeping its scores in float16 is within the bound at
    E = 16, 64, 128 and 256 alike, and its error there is no artefact of the draw (above a
    float32-score kernel's, whose output is rounded to float16 alike)."""
    ratios = {e: _error_ratio(fn, e) for e in HEAD_DIMS}
    honest = {e: _error_ratio(lse_attention, e) for e in HEAD_DIMS}
    assert all(r <= 1 for r in ratios.values()), ratios
    assert all(ratios[e] > 2 * honest[e] for e in HEAD_DIMS), (ratios, honest)
    assert max(ratios.values()) < 10 * min(ratios.values()), ratios  # no head dim singled out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_the_scale_term_is_the_same_at_every_scale(dtype: str) -> None:
    """TOL-2: r_alpha = 4u_d whether or not sqrt(alpha) is a power of two (the default
    scale of E = 16 and 64, an explicit 1/4 and 1/3)."""
    for head_dim in HEAD_DIMS:
        base = product_coefficient(dtype, head_dim)
        for scale in (None, 0.25, 1 / 3, 1 / 8):
            assert product_coefficient(dtype, head_dim, scale) == base
        expected = 4 * UNIT_ROUNDOFF[dtype]
        assert base - (head_dim + 4) * min(UNIT_ROUNDOFF[dtype], UNIT_ROUNDOFF["float32"]) == (
            pytest.approx(expected)
        )
