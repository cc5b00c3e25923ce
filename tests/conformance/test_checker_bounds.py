"""CONF-11: the suite judges a kernel's values with the bound the clause states (TOL-2,
evaluated on the inputs the kernel received), not with a tolerance of its own.

A kernel that returns the float64 definition moved by a fixed fraction of its own TOL-2
bound, element by element, is judged only by where that fraction lies: half the bound
passes ``matches-reference`` (SDPA-7.3), twice the bound fails it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from attnspec.conformance import check, declare
from attnspec.reference import tolerance

CHEAP = {"max_len": 48, "max_head_dim": 16, "max_batch_heads": 8}


def _off_by(fraction: float) -> Any:
    """The definition (TOL-1's float64 evaluation) plus ``fraction`` times TOL-2's bound."""

    @declare(mask=False, causal=False, scale=False, dtypes=("float32",))
    def kernel(q: Any, k: Any, v: Any) -> Any:
        inputs = [np.asarray(x, dtype=np.float64) for x in (q, k, v)]
        bound = tolerance.error_bound(*inputs, dtype="float32", weights=False)
        out = np.asarray(bound.out) + fraction * np.asarray(bound.out_tolerance)
        return out.astype(np.float32)

    return kernel


@pytest.mark.parametrize(("fraction", "conforms"), [(0.5, True), (-0.5, True), (2.0, False)])
def test_values_are_judged_by_the_tol2_bound(fraction: float, conforms: bool) -> None:
    """CONF-11, TOL-2, SDPA-7.3: within the stated bound passes, outside it fails."""
    report = check(_off_by(fraction), only="matches-reference", backend="numpy", seed=0, **CHEAP)
    (verdict,) = report.verdicts
    assert (verdict.status == "passed") is conforms, verdict.detail
