"""ALIBI-3 judged against the exact standard slopes: a float64 kernel that computes Press
et al.'s slopes in float64 conforms for every head count, and one that uses the geometric
formula for every head count (right for powers of two only) does not (issue 32's gap: the
definition was built from float32 slopes, so the exact float64 kernel failed at H = 6, 12)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from oracle_features import press_slopes
from support import verdict_of

from attnspec.conformance import declare
from attnspec.conformance.judge.verdict import FAILED, PASSED
from attnspec.reference import scaled_dot_product_attention


def _with_slopes(slopes_of: Any) -> Any:
    @declare(gqa=True, alibi=True, alibi_builtin_slopes=True, alibi_keyword="use_alibi")
    def kernel(q: Any, k: Any, v: Any, *, use_alibi: bool = False, **options: Any) -> Any:
        # options: the mask, is_causal and scale the suite passes, to the reference as given
        slopes = np.asarray(slopes_of(q.shape[-3]), dtype=np.float64) if use_alibi else None
        out = scaled_dot_product_attention(
            *(a.astype(np.float64) for a in (q, k, v)), alibi_slopes=slopes, **options
        )
        return np.asarray(out).astype(q.dtype)

    return kernel


def _geometric(n_heads: int) -> list[float]:
    return [2.0 ** (-8.0 * (h + 1) / n_heads) for h in range(n_heads)]


@pytest.mark.parametrize("seed", [0, 1])
def test_exact_float64_slopes_conform(seed: int) -> None:
    """ALIBI-3: slopes computed exactly in float64 (Press et al.'s recursive get_slopes)."""
    verdict = verdict_of("alibi-standard-slopes", _with_slopes(press_slopes), seed=seed)
    assert verdict.status == PASSED, verdict.detail


def test_geometric_slopes_for_every_head_count_fail() -> None:
    """ALIBI-3: 2^(-8(h+1)/H) for H = 3, 5, 6, ... is not the standard's interleaving."""
    verdict = verdict_of("alibi-standard-slopes", _with_slopes(_geometric), seed=0)
    assert verdict.status == FAILED, verdict.detail
