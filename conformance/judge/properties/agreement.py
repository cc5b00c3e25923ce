"""SDPA-7.1 and SDPA-7.3: the output is attention as defined, within TOL-2."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from ....backends import Backend
from ...call.problem import Problem
from ...claims.declaration import KernelDeclaration
from ...draw.sizes import current
from ...draw.strategies import draw_dims, draw_problem, with_declared_batch
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
from ..registration import dense_only, register
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


# Keys of a peaked long row (their weight e^-gap each beside the top key's): in float16
# and bfloat16 each is below half a unit in the last place of a row sum near 1, so a sum
# accumulated in the input dtype (SDPA-7.2) drops them all, about 0.3 to 1.4 of the row's
# weight; with fewer keys a float32 sum hides it.
PEAKED_ROW_KEYS = (1025, 2049, 4096)
PEAKED_ROW_GAP = {"float16": 8.0, "bfloat16": 6.0}
# sqrt of its default scale 1/4 is a power of two: the scale is applied exactly, and the
# scores are exactly 0 and the gap (TOL-2 still allows r_alpha = 4u_d, as at every scale)
PEAKED_ROW_HEAD_DIM = 16


def _takes_long_half_precision_rows(declaration: KernelDeclaration) -> str | None:
    reason = dense_only(declaration)
    if reason is None and declaration.equal_lengths:
        reason = "the kernel declares equal_lengths: its rows are as long as its queries"
    if reason is None and declaration.dtypes is not None:
        if not set(declaration.dtypes) & set(PEAKED_ROW_GAP):
            reason = "the kernel claims no half-precision dtype (float16, bfloat16)"
    return reason


def _has_half_precision(backend: Backend) -> str | None:
    if set(backend.dtype_names) & set(PEAKED_ROW_GAP):
        return None
    return f"{backend.name} has no half-precision dtype (float16, bfloat16)"


# (the registration's shape recurs in each fixed property that needs a backend condition:
# register() is the one way to declare a property, a row of the registry)
@register(
    "long-peaked-rows",
    "SDPA-7.3",
    kind="fixed",
    applies=_takes_long_half_precision_rows,
    applies_on=_has_half_precision,
)
def long_peaked_rows(kernel: KernelUnderTest, seed: int) -> None:
    """In each half-precision dtype the kernel claims, decode rows of 1025 to 4096 keys
    (within --max-len; the longest only on a backend that compiles per shape) whose one top
    key scores a gap above all the others are within TOL-2 of the definition: a kernel that
    sums the exponentials, or P V, in the input dtype (SDPA-7.2) drops every other key's
    weight there, far beyond the bound, while on N(0, 1) scores its error hides inside it."""
    rng = np.random.default_rng(seed)
    max_len = current().limits.max_len
    lengths = [n for n in PEAKED_ROW_KEYS if n <= max_len] or [max_len]
    if kernel.backend.compiles_per_shape:  # each length a compilation: the longest row
        lengths = lengths[-1:]
    for dtype in (d for d in kernel.dtypes if d in PEAKED_ROW_GAP):
        for n_keys in lengths:
            problem = _peaked_rows(kernel, rng, dtype, n_keys, PEAKED_ROW_GAP[dtype])
            assert_matches_reference(kernel, problem, what=f"out (peaked rows of {n_keys} keys)")


def _peaked_rows(
    kernel: KernelUnderTest, rng: np.random.Generator, dtype: str, n_keys: int, gap: float
) -> Problem:
    """Two query rows, row r with channel r = 1 and its own top key (channel r = gap * 4;
    every other key 0 in channels 0 and 1, N(0, 1) elsewhere): scores gap and 0 exactly."""
    head_dim = PEAKED_ROW_HEAD_DIM
    q = np.zeros((1, 2, head_dim))
    q[0, [0, 1], [0, 1]] = 1.0
    k = rng.standard_normal((1, n_keys, head_dim))
    k[:, :, :2] = 0.0
    tops = rng.choice(n_keys, size=2, replace=n_keys < 2)  # one key (--max-len 1): shared
    k[0, tops, [0, 1]] = gap * math.sqrt(head_dim)
    v = rng.standard_normal((1, n_keys, head_dim))
    q, k, v = (with_declared_batch(kernel, kernel.rounded(a, dtype)) for a in (q, k, v))
    return Problem(q=q, k=k, v=v, dtype=dtype)


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
