"""TOL-2/TOL-4: the bound's intermediates that reference/tolerance.py computes once and
reuses are the arrays it would otherwise recompute, to the bit (issue 33: the bound
evaluates each of them once)."""

from __future__ import annotations

import array_api_compat.numpy as xp
import numpy as np
import pytest

from attnspec.reference.features import softcapped
from attnspec.reference.options import ScoreOptions, filled
from attnspec.reference.sdpa import allowed_and_capped_scores, allowed_scores, prepare_with_features
from attnspec.reference.tolerance import _exp_without_overflow


@pytest.mark.parametrize("overflowing", [False, True])
def test_exp_without_overflow_is_exp_then_inf(overflowing: bool) -> None:
    """TOL-2's weights: exp of the shifted scores, inf where it overflows (a row whose
    largest score is +inf, SDPA-8), with and without such entries."""
    x = np.random.default_rng(0).standard_normal((3, 5, 7)) * 50
    if overflowing:
        x[0, 1, 2], x[2, 0, 0] = 1e300, 710.0
    got = _exp_without_overflow(xp, xp.asarray(x))
    overflows = x > np.log(np.finfo(np.float64).max)
    with np.errstate(over="ignore"):
        expected = np.where(overflows, np.inf, np.exp(np.where(overflows, 0.0, x)))
    assert np.asarray(got).tobytes() == expected.tobytes()


@pytest.mark.parametrize("softcap", [None, 0.5, 30.0])
def test_capped_scores_are_the_ones_the_scores_were_made_from(softcap: float | None) -> None:
    """SOFTCAP-1/TOL-4: the capped scores the bound uses (c tanh(alpha q.k / c)) are the
    product scaled and capped afresh, and the scores and allowed set those of
    allowed_scores, bit for bit, with a bias, a mask and ALiBi."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s) * 3 for s in ((2, 4, 5, 8), (2, 2, 6, 8), (2, 2, 6, 3)))
    problem = prepare_with_features(
        q,
        k,
        v,
        filled(
            ScoreOptions,
            {
                "bias": rng.standard_normal((5, 6)),
                "mask": rng.random((5, 6)) < 0.7,
                "is_causal": True,
                "causal_alignment": "bottom_right",
                "scale": 0.3,
                "softcap": softcap,
                "alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625]),
            },
        ),
        "test",
    )
    scores, allowed, capped = allowed_and_capped_scores(problem)
    plain_scores, plain_allowed = allowed_scores(problem)
    assert scores.tobytes() == plain_scores.tobytes()
    assert allowed.tobytes() == plain_allowed.tobytes()
    if softcap is None:
        assert capped is None
    else:
        product = xp.matmul(problem.q, xp.matrix_transpose(problem.k)) * problem.scale
        assert capped.tobytes() == softcapped(xp, product, softcap).tobytes()
