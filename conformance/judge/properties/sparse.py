"""SPARSE-6: a sparse kernel equals dense attention with its pattern's mask.

The kernel declares one pattern (``SparseClaim``); the pattern's mask from
``attnspec.reference.sparse_mask`` defines what it must compute (SPARSE-1.1).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ...call.problem import Problem
from ...claims.declaration import KernelDeclaration
from ...draw.strategies import random_values
from ..assertions import assert_identical, assert_within_bound, first_index
from ..bounds import reference_bound
from ..failures import PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import register
from ._helpers import assert_output_shape_and_dtype, draw_sparse_problem


def sparse_only(declaration: KernelDeclaration) -> str | None:
    if declaration.sparse is None:
        return "the kernel does not declare a sparse pattern"
    return None


def _dense_equivalent(problem: Problem, mask: np.ndarray) -> Problem:
    """The same call as dense attention with the pattern's mask (what the bound needs)."""
    return problem.with_(mask=mask, extra={})


@register("sparse-matches-dense", "SPARSE-6.4", applies=sparse_only)
def sparse_matches_dense(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Every output lies within TOL-2 of dense attention with the pattern's mask, in q's
    dtype and the spec's output shape (SDPA-1.3)."""
    problem, mask = draw_sparse_problem(kernel, data)
    raw, _ = kernel.call_on(problem)
    assert_output_shape_and_dtype(kernel, problem, raw)
    out = kernel.numpy(raw)
    bound = reference_bound(_dense_equivalent(problem, mask), kernel.declaration)
    assert_within_bound(
        out, np.asarray(bound.out), np.asarray(bound.out_tolerance), "out", problem, kernel
    )


@register("sparse-weights-exactly-zero", "SPARSE-6.1", applies=sparse_only)
def sparse_weights_exactly_zero(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Weights of keys outside S(i) (observed through V = I) are exactly 0, never tiny."""
    problem, mask = draw_sparse_problem(kernel, data, weights=True)
    weights = kernel.observed_weights(problem)
    leaked = (weights != 0) & ~np.broadcast_to(mask, weights.shape)
    if leaked.any():
        at = first_index(leaked)
        claim = kernel.declaration.sparse
        assert claim is not None  # the property applies only to a sparse declaration
        raise PropertyFailure(
            f"weight{at} = {float(weights[at])!r}, but key {at[-1]} is outside S({at[-2]}) of "
            f"pattern {claim.pattern!r} and must weigh exactly 0",
            problem,
            kernel,
            shows_weights=True,
        )


def _outside_row(kernel: KernelUnderTest, data: st.DataObject, replacement: str) -> None:
    problem, mask = draw_sparse_problem(kernel, data)
    row = data.draw(st.integers(0, mask.shape[0] - 1), label="query row")
    outside = ~mask[row]
    if not outside.any():
        return  # S(row) holds every key: nothing is masked out for this row
    rng = np.random.default_rng(row)
    changed_k, changed_v = problem.k.copy(), problem.v.copy()
    if replacement == "finite":
        changed_k[..., outside, :] = random_values(
            kernel, rng, changed_k[..., outside, :].shape, problem.dtype, 5.0
        )
        changed_v[..., outside, :] = random_values(
            kernel, rng, changed_v[..., outside, :].shape, problem.dtype, 5.0
        )
    else:
        changed_k[..., outside, :] = np.nan
        changed_v[..., outside, :] = np.inf
    before = kernel.output(problem)[..., row, :]
    changed = problem.with_(k=changed_k, v=changed_v)
    after = kernel.output(changed)[..., row, :]
    assert_identical(
        after,
        before,
        f"out[..., {row}, :] after changing keys/values outside S({row}) to {replacement} values",
        changed,
        kernel,
    )


@register("sparse-masked-ignored", "SPARSE-6.2", applies=sparse_only)
def sparse_masked_ignored(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Changing keys and values outside S(i) to other finite values leaves row i identical."""
    _outside_row(kernel, data, "finite")


@register("sparse-masked-nonfinite-ignored", "SPARSE-6.3", applies=sparse_only)
def sparse_masked_nonfinite_ignored(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """NaN keys and inf values outside S(i) leave row i identical (no 0 * NaN leak)."""
    _outside_row(kernel, data, "non-finite")
