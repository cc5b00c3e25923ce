"""SDPA-8: what values at disallowed positions may do (nothing), and NaN propagation.

Keys and values are shared by every query, so K/V are changed only in columns that the
mask disallows for every query; bias entries are per query, so every bias entry whose
position is disallowed wherever it is broadcast to is changed too.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ..assertions import assert_identical, first_index
from ..failures import PropertyFailure
from ..kernel import KernelUnderTest, Problem
from ..oracle import reference_bound
from ..registry import dense_only, needs, register
from ..strategies import draw_problem, draw_rng, draw_subset, random_values
from .softmax import allowed_keys, compared_rows

NON_FINITE = (np.nan, np.inf, -np.inf)


def disallowed_everywhere(allowed: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Entries of an array of ``shape`` (broadcast to ``allowed``'s shape) that are
    disallowed at every position they are broadcast to."""
    padded = (1,) * (allowed.ndim - len(shape)) + tuple(shape)
    axes = tuple(a for a, n in enumerate(padded) if n == 1 and allowed.shape[a] != 1)
    return (~allowed).all(axis=axes, keepdims=True).reshape(shape)


def _masked_columns_problem(
    data: st.DataObject, kernel: KernelUnderTest
) -> tuple[Problem, list[int]]:
    """A problem whose mask disallows some key columns for every query."""
    causal = "maybe" if kernel.declaration.mask_and_causal else "never"
    problem = draw_problem(data, kernel, mask="always", causal=causal, min_keys=1)
    n_keys = problem.k.shape[-2]
    columns = draw_subset(data, n_keys, "masked columns")
    mask = problem.mask.copy()
    mask[..., columns] = False
    return problem.with_(mask=mask), columns


def _mask_and_causal(problem: Problem, kernel: KernelUnderTest) -> np.ndarray:
    """Positions the mask or causal rule allows: SDPA-8.1 speaks of bias entries there."""
    return allowed_keys(problem.with_(bias=None), kernel.declaration)


def _compare(kernel: KernelUnderTest, problem: Problem, other: Problem, what: str) -> None:
    rows = compared_rows(problem, kernel.declaration)
    out, out_other = kernel.run(problem), kernel.run(other)
    assert_identical(np.where(rows, out_other, 0.0), np.where(rows, out, 0.0), what, other,
                     kernel)


@register("masked-values-ignored", "SDPA-8.1", applies=needs("mask"))
def masked_values_ignored(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Other finite keys/values in columns masked for every query, and other finite bias
    entries at disallowed positions, leave every output identical."""
    problem, columns = _masked_columns_problem(data, kernel)
    rng = draw_rng(data)
    magnitude = data.draw(st.sampled_from([1.0, 10.0]), label="new magnitude")
    changed: dict[str, np.ndarray] = {}
    for name in ("k", "v"):
        a = getattr(problem, name).copy()
        a[..., columns, :] = random_values(kernel, rng, a[..., columns, :].shape, problem.dtype,
                                           magnitude)
        changed[name] = a
    if problem.bias is not None:
        hidden = disallowed_everywhere(_mask_and_causal(problem, kernel), problem.bias.shape)
        fresh = random_values(kernel, rng, problem.bias.shape, problem.dtype, magnitude)
        changed["bias"] = np.where(hidden, fresh, problem.bias)
    _compare(kernel, problem, problem.with_(**changed),
             f"out after changing keys/values in masked columns {columns} and bias entries at "
             "disallowed positions [SDPA-8.1]")


@register("masked-nonfinite-ignored", "SDPA-8.2", applies=needs("mask"))
def masked_nonfinite_ignored(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """NaN or +-inf in keys/values of columns masked for every query, or in bias entries
    at disallowed positions, leave every output identical (no NaN appears)."""
    problem, columns = _masked_columns_problem(data, kernel)
    value = data.draw(st.sampled_from(NON_FINITE), label="non-finite value")
    targets = ["k", "v"] + (["bias"] if problem.bias is not None else [])
    target = data.draw(st.sampled_from(targets), label="poisoned array")
    whole = data.draw(st.booleans(), label="poison every entry")
    a = getattr(problem, target).copy()
    if target == "bias":
        region = disallowed_everywhere(_mask_and_causal(problem, kernel), a.shape)
    else:
        region = np.zeros(a.shape, dtype=bool)
        region[..., columns, :] = True
    if not whole:  # a single entry: the first in the region (always one: a column is masked)
        first = np.zeros(a.size, dtype=bool)
        first[np.flatnonzero(region)[:1]] = True
        region = first.reshape(a.shape)
    a[region] = value
    _compare(kernel, problem, problem.with_(**{target: a}),
             f"out after writing {value} into {target} at disallowed positions (masked columns "
             f"{columns}) [SDPA-8.2]")


@register("nan-propagates", "SDPA-8.3", applies=dense_only)
def nan_propagates(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """A NaN in q_i, in k_j or bias_ij of an allowed key, or in v_j's column c of an allowed
    key reaches the outputs the definition says (row i, rows that may attend j, column c)."""
    problem = draw_problem(data, kernel, min_queries=1, min_keys=1)
    targets = ["q", "k", "v"] + (["bias"] if problem.bias is not None else [])
    target = data.draw(st.sampled_from(targets), label="array with a NaN")
    a = getattr(problem, target).copy()
    index = np.unravel_index(data.draw(st.integers(0, a.size - 1), label="NaN position"), a.shape)
    a[index] = np.nan
    poisoned = problem.with_(**{target: a})
    expected = np.isnan(np.asarray(reference_bound(poisoned, kernel.declaration).out))
    out = kernel.run(poisoned)
    missing = expected & ~np.isnan(out)
    if missing.any():
        at = first_index(missing)
        where = tuple(int(i) for i in index)
        raise PropertyFailure(
            f"out{at} = {out[at]!r}, but the NaN at {target}{where} reaches it, so it should "
            f"be NaN; {int(missing.sum())} of {int(expected.sum())} such elements are not "
            "[SDPA-8.3, TOL-3]",
            poisoned, kernel,
        )
