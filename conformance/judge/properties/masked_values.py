"""SDPA-8: what values at disallowed positions may do (nothing), and NaN propagation.

Keys and values are shared by every query, so K/V are changed only in columns that the
mask disallows for every query; bias entries are per query, so every bias entry whose
position is disallowed wherever it is broadcast to is changed too.  The new values keep
every score finite in the accumulation precision (SDPA-8.1's precondition, that of
SDPA-7.4), up to the largest values that precondition allows.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ...call.problem import Problem
from ...draw.input_features import allowed_keys
from ...draw.realistic_values import LARGEST_FINITE
from ...draw.strategies import draw_problem, draw_rng, draw_subset
from ..assertions import assert_identical, compared_rows, first_index
from ..bounds import reference_bound
from ..failures import PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import dense_only, needs, register
from ..reproduce import replaying
from ._helpers import pair_score_magnitudes

NON_FINITE = (np.nan, np.inf, -np.inf)
LARGEST = "largest within SDPA-7.4"
NEW_MAGNITUDES: tuple[float | str, ...] = (1.0, 10.0, LARGEST)
# SDPA-7.2: half precision accumulates in float32, float32 and float64 in themselves
ACCUMULATION_LARGEST = {
    **{d: LARGEST_FINITE["float32"] for d in ("float16", "bfloat16", "float32")},
    "float64": LARGEST_FINITE["float64"],
}


def score_magnitudes(problem: Problem) -> np.ndarray:
    """``max(|alpha|, 1) sum_e |q_ie| |k_je| + |b_ij|`` for every pair ``(..., Hq, Lq, Lk)``.

    Every partial result of a score — the dot product ``q_i . k_j`` (a kernel may scale
    after it), ``alpha q_i . k_j`` and its sum with ``b_ij`` — is at most this (times
    1 + O(E u)), so all are finite in the accumulation precision (SDPA-7.4, SDPA-8.1) when
    it is well below that precision's largest number.
    """
    head_dim = problem.q.shape[-1]
    alpha = abs(problem.scale) if problem.scale is not None else head_dim**-0.5
    magnitude = max(alpha, 1.0) * pair_score_magnitudes(problem.with_(scale=1.0))
    return magnitude if problem.bias is None else magnitude + np.abs(problem.bias)


def scores_within_precondition(problem: Problem) -> bool:
    """SDPA-8.1's precondition with a factor 2 to spare for the kernel's own rounding."""
    limit = ACCUMULATION_LARGEST[problem.dtype] / 2
    return bool(np.all(score_magnitudes(problem) <= limit))


def disallowed_everywhere(allowed: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Entries of an array of ``shape`` (broadcast to ``allowed``'s shape) that are
    disallowed at every position they are broadcast to."""
    padded = (1,) * (allowed.ndim - len(shape)) + tuple(shape)
    axes = tuple(a for a, n in enumerate(padded) if n == 1 and allowed.shape[a] != 1)
    return (~allowed).all(axis=axes, keepdims=True).reshape(shape)


def _masked_columns_problem(
    data: st.DataObject,
    kernel: KernelUnderTest,
    *,
    tight: bool = False,
) -> tuple[Problem, list[int]]:
    """A problem whose mask disallows some key columns for every query (``tight``: with a
    bias of a few units, see :func:`~..strategies.draw_problem`)."""
    causal = "maybe" if kernel.declaration.mask_and_causal else "never"
    problem = draw_problem(data, kernel, mask="always", causal=causal, min_keys=1, tight=tight)
    n_keys = problem.k.shape[-2]
    columns = draw_subset(data, n_keys, "masked columns")
    mask = problem.required("mask").copy()
    mask[..., columns] = False
    return problem.with_(mask=mask), columns


def _mask_and_causal(problem: Problem, kernel: KernelUnderTest) -> np.ndarray:
    """Positions the mask or causal rule allows: SDPA-8.1 speaks of bias entries there."""
    return allowed_keys(problem.with_(bias=None), kernel.declaration)


def _compare(kernel: KernelUnderTest, problem: Problem, other: Problem, what: str) -> None:
    rows = compared_rows(problem, kernel.declaration)
    out, out_other = kernel.output(problem), kernel.output(other)
    with replaying([("original", problem)], "out_original", compared=rows):
        assert_identical(
            np.where(rows, out_other, 0.0), np.where(rows, out, 0.0), what, other, kernel
        )


def _replace_excluded(
    problem: Problem,
    columns: list[int],
    hidden: np.ndarray | None,
    fresh: dict[str, np.ndarray],
    factor: float,
) -> Problem:
    """``problem`` with masked K/V columns and hidden bias entries set to factor * fresh."""
    changed: dict[str, np.ndarray] = {}
    for name in ("k", "v"):
        a = getattr(problem, name).copy()
        a[..., columns, :] = factor * fresh[name]
        changed[name] = a
    if hidden is not None:
        changed["bias"] = np.where(hidden, factor * fresh["bias"], problem.required("bias"))
    return problem.with_(**changed)


def largest_factor(
    problem: Problem, columns: list[int], hidden: np.ndarray | None, fresh: dict[str, np.ndarray]
) -> float:
    """The largest t such that t * fresh is finite in the dtype and every score stays below
    a quarter of the accumulation precision's largest number (SDPA-8.1's precondition with
    room for rounding): scores are linear in t, |s| <= S_kept + t S_fresh."""
    zeros = {name: np.zeros_like(a) for name, a in fresh.items()}
    kept = score_magnitudes(_replace_excluded(problem, columns, hidden, zeros, 0.0))
    only_fresh = problem.with_(
        k=np.zeros_like(problem.k), bias=None if hidden is None else np.zeros_like(problem.bias)
    )
    unit = score_magnitudes(_replace_excluded(only_fresh, columns, hidden, fresh, 1.0))
    room = ACCUMULATION_LARGEST[problem.dtype] / 4 - kept
    with np.errstate(divide="ignore", over="ignore"):  # no fresh score: no limit
        by_scores = float(np.min(np.where(unit > 0, room / unit, np.inf), initial=np.inf))
    largest_fresh = max(float(np.max(np.abs(a), initial=0.0)) for a in fresh.values())
    by_dtype = LARGEST_FINITE[problem.dtype] / 2 / max(largest_fresh, 1e-300)
    factor = min(by_scores, by_dtype)
    return factor if np.isfinite(factor) else 1.0  # nothing fresh (an empty axis): any will do


@register("masked-values-ignored", "SDPA-8.1", applies=needs("mask"))
def masked_values_ignored(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Other finite keys/values in columns masked for every query, and other finite bias
    entries at disallowed positions, leave every output identical — for values up to the
    largest that keep every score finite in the accumulation precision (SDPA-7.4)."""
    # A padding bias of finfo.min (float32, bfloat16, float64) leaves no room below the
    # precondition for the kernel's rounding: such a problem is outside SDPA-8.1.
    problem, columns = _masked_columns_problem(data, kernel, tight=True)
    rng = draw_rng(data)
    magnitude = data.draw(st.sampled_from(NEW_MAGNITUDES), label="new magnitude")
    fresh = {
        name: rng.standard_normal(getattr(problem, name)[..., columns, :].shape)
        for name in ("k", "v")
    }
    hidden = None
    if problem.bias is not None:
        hidden = disallowed_everywhere(_mask_and_causal(problem, kernel), problem.bias.shape)
        fresh["bias"] = rng.standard_normal(problem.bias.shape)
    factor = (
        largest_factor(problem, columns, hidden, fresh)
        if isinstance(magnitude, str)  # LARGEST, the only str
        else magnitude
    )
    other = _replace_excluded(problem, columns, hidden, fresh, factor)
    other = other.with_(
        **{
            name: kernel.rounded(getattr(other, name), problem.dtype)
            for name in ("k", "v", "bias")
            if getattr(other, name) is not None
        }
    )
    if not scores_within_precondition(other):  # the construction above rules this out
        raise AssertionError(f"masked-values-ignored drew scores beyond SDPA-7.4: {factor=}")
    _compare(
        kernel,
        problem,
        other,
        f"out after changing keys/values in masked columns {columns} and bias entries at "
        f"disallowed positions to values of magnitude {factor:.3g} [SDPA-8.1]",
    )


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
    _compare(
        kernel,
        problem,
        problem.with_(**{target: a}),
        f"out after writing {value} into {target} at disallowed positions (masked columns "
        f"{columns}) [SDPA-8.2]",
    )


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
    out = kernel.output(poisoned)
    missing = expected & ~np.isnan(out)
    if missing.any():
        at = first_index(missing)
        where = tuple(int(i) for i in index)
        raise PropertyFailure(
            f"out{at} = {out[at]!r}, but the NaN at {target}{where} reaches it, so it should "
            f"be NaN; {int(missing.sum())} of {int(expected.sum())} such elements are not "
            "[SDPA-8.3, TOL-3]",
            poisoned,
            kernel,
        )
