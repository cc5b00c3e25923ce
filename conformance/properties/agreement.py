"""SDPA-7.1 and SDPA-7.3: the output is attention as defined, within TOL-2."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ..assertions import (
    assert_matches_reference,
    assert_weights_match,
    assert_within_bound,
    compared_rows,
    first_index,
)
from ..bounds import weights_bound
from ..failures import PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import register
from ..strategies import draw_dims, draw_problem
from ._helpers import with_awkward_key_count


@register("matches-reference", "SDPA-7.3")
def matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Every output (and returned weight) is within TOL-2 of the float64 definition,
    for every claimed dtype, with masks, bias, causal, GQA and explicit scales drawn."""
    # rows longer than 8 keys catch truncations such as top-k attention; key counts one past
    # a block catch what tiled kernels get wrong in a partial block (as layout-independence
    # draws them, so an accuracy failure there is this clause's, met here first)
    dims = with_awkward_key_count(data, kernel, draw_dims(data, kernel, max_len=24))
    problem = draw_problem(data, kernel, dims=dims)
    if kernel.declaration.returns_weights:
        out, weights = kernel.output_with_weights(problem)
        assert_matches_reference(kernel, problem, out)
        assert_weights_match(kernel, problem, weights)
    else:
        assert_matches_reference(kernel, problem)


@register("rows-sum-to-one", "SDPA-7.1")
def rows_sum_to_one(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Weights (returned, or observed through V = I) are >= 0 and each row with an
    allowed key sums to 1 within TOL-2; rows with none sum to 0 (SDPA-5.1; not judged
    for a kernel that waives it, CONF-7)."""
    problem = draw_problem(data, kernel, min_keys=1, weights=True)
    _, weights = kernel.output_with_weights(problem)
    expected, tolerance = weights_bound(problem, kernel.declaration)
    judged = compared_rows(problem, kernel.declaration)
    negative = (weights < 0) & judged
    if negative.any():
        at = first_index(negative)
        raise PropertyFailure(
            f"weight{at} = {weights[at]!r} is negative",
            problem,
            kernel,
            shows_weights=kernel.observes_weights,
        )
    sums = np.asarray(expected).sum(axis=-1)
    assert_within_bound(
        np.where(judged[..., 0], weights.sum(axis=-1), sums),
        sums,
        np.asarray(tolerance).sum(axis=-1),
        "row sum of weights",
        problem,
        kernel,
        shows_weights=kernel.observes_weights,
    )
