"""SDPA-7.6: the invariances that follow from the definition of SDPA-7.1.

Two runs of the kernel on related problems are compared with each other.  Where the
float64 definitions of the two coincide exactly, each run is within its own TOL-2 bound
of that one value, so the runs differ by at most the sum of the two bounds; summation
order may differ between the runs, so nothing here is required bit-for-bit except where
an output does not depend on the changed inputs at all (batch/head independence).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ....reference.tolerance import UNIT_ROUNDOFF
from ...call.problem import Problem
from ...draw.sizes import current, realistic
from ...draw.strategies import draw_dims, draw_permutation, draw_problem, draw_rng, random_values
from ..assertions import (
    assert_identical,
    assert_shape,
    assert_within_bound,
    compared_rows,
    keyless_rows_unjudged,
)
from ..bounds import reference_bound
from ..kernel import KernelUnderTest
from ..registration import needs, register
from ..reproduce import replaying
from ._helpers import within_validity

# Value pairs (a, b) for linearity: with V1, V2 odd multiples of 1/4 in [-3.75, 3.75],
# a*V1 + b*V2 is a multiple of 1/8 in [-15, 15], exact in every dtype (8 significant bits
# suffice).  Nonzero values keep every output column of V1 and V2 far from the subnormal
# range, where TOL-2 has only its absolute floor and so says little.
LINEAR_COEFFICIENTS = (1.0, -1.0, 2.0, -2.0, 0.5, -0.5)


def _tolerance(kernel: KernelUnderTest, problem: Problem) -> np.ndarray:
    return np.asarray(reference_bound(problem, kernel.declaration).out_tolerance)


def _assert_runs_agree(
    kernel: KernelUnderTest,
    actual: np.ndarray,
    expected: np.ndarray,
    tolerance: np.ndarray,
    what: str,
    problem: Problem,
    replay: tuple[Sequence[tuple[str, Problem]], str, str],
) -> None:
    """``actual`` (the run on ``problem``) within ``tolerance`` of ``expected`` (the other
    run's output, rearranged as ``problem``'s); rows of ``problem`` without an allowed key
    are not compared for a kernel that waives SDPA-5.1, which alone fixes them (CONF-7).
    ``replay``: the other calls (name, problem), and the expressions of ``expected`` and of
    ``tolerance`` beyond ``problem``'s own bound (:class:`.reproduce.ReplayedFailure`), so
    that the reproduction replays every call and the comparison."""
    with replaying(*replay):
        assert_shape(actual, expected.shape, what, problem, kernel)
        judged = keyless_rows_unjudged(
            kernel, compared_rows(problem, kernel.declaration), actual, expected
        )
        assert_within_bound(judged, expected, tolerance, what, problem, kernel)


def _assert_unchanged(
    kernel: KernelUnderTest,
    original: Problem,
    changed: Problem,
    what: str,
    rows: list[int] | None = None,
) -> None:
    """The kernel's output on ``changed`` within the sum of the two runs' TOL-2 bounds of
    its output on ``original``, whose rows are taken in the order ``rows`` (the queries'
    permutation) where given."""
    out, out_changed = kernel.output(original), kernel.output(changed)
    tolerance = _tolerance(kernel, original)
    index: tuple[Any, ...] = (...,) if rows is None else (..., rows, slice(None))
    taken = "" if rows is None else f"[..., {rows}, :]"
    _assert_runs_agree(
        kernel,
        out_changed,
        out[index],
        _tolerance(kernel, changed) + tolerance[index],
        what,
        changed,
        ([("original", original)], f"out_original{taken}", f"bound(problem_original){taken}"),
    )


def _take(a: np.ndarray | None, order: list[int], axis: int, size: int) -> np.ndarray | None:
    """``a`` permuted along ``axis`` unless that axis is absent or broadcast."""
    if a is None or a.shape[axis] != size:
        return a
    return np.take(a, order, axis=axis)


def _draw_permuted(
    kernel: KernelUnderTest, data: st.DataObject, moved: str
) -> tuple[Problem, list[int], Problem]:
    """A drawn problem, a drawn order of its queries (``moved`` "query") or of its keys and
    values ("key"), and the problem with those in that order, with the rows or columns of
    mask and bias (a broadcast axis stays as it is)."""
    problem = within_validity(kernel, draw_problem(data, kernel, causal="never"))
    axis, length = (-2, problem.q.shape[-2]) if moved == "query" else (-1, problem.k.shape[-2])
    order = draw_permutation(data, length, f"{moved} order")
    names = ("q",) if moved == "query" else ("k", "v")
    arrays = {name: getattr(problem, name)[..., order, :] for name in names}
    permuted = problem.with_(
        **arrays,
        mask=_take(problem.mask, order, axis, length),
        bias=_take(problem.bias, order, axis, length),
    )
    return problem, order, permuted


@register("query-permutation", "SDPA-7.6")
def query_permutation(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Permuting the queries (with the rows of mask and bias) permutes the output rows,
    within the sum of the two runs' TOL-2 bounds."""
    problem, order, permuted = _draw_permuted(kernel, data, "query")
    what = f"out with queries in order {order} vs out rows in that order [SDPA-7.6]"
    _assert_unchanged(kernel, problem, permuted, what, rows=order)


@register("key-permutation", "SDPA-7.6")
def key_permutation(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Permuting keys and values jointly (with the columns of mask and bias) leaves the
    output unchanged, within the sum of the two runs' TOL-2 bounds."""
    problem, order, permuted = _draw_permuted(kernel, data, "key")
    what = f"out with keys/values in order {order} vs the original out [SDPA-7.6]"
    _assert_unchanged(kernel, problem, permuted, what)


@register("batch-head-independence", "SDPA-7.6")
def batch_head_independence(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Changing the inputs of one batch element, one key/value head (with its query heads)
    or one query head leaves every other output identical."""
    if realistic():  # as gqa-mapping asks, so the two meet the same pooled shapes
        dims = draw_dims(data, kernel, min_kv_heads=2, min_groups=2)
    else:
        dims = draw_dims(data, kernel, where=lambda dims: dims.n_kv_heads >= 2)
        if current().pool is None or dims.n_kv_heads < 2:  # a pooled shape: compiled already
            dims = replace(dims, n_kv_heads=dims.n_kv_heads + 1)  # two heads to tell apart
    problem = draw_problem(data, kernel, dims=dims)
    groups, batch_size = dims.groups, math.prod(dims.batch)
    choices = ["key/value head", "query head"] + (["batch element"] if batch_size > 1 else [])
    part = data.draw(st.sampled_from(choices), label="changed part")
    rng = draw_rng(data)
    magnitude = data.draw(st.sampled_from([1.0, 4.0]), label="new magnitude")
    q, k, v = problem.q.copy(), problem.k.copy(), problem.v.copy()

    def renew(a: np.ndarray, where: tuple[Any, ...]) -> None:
        a[where] = random_values(kernel, rng, a[where].shape, problem.dtype, magnitude)

    if part == "batch element":
        index = np.unravel_index(
            data.draw(st.integers(0, batch_size - 1), label="batch"), dims.batch
        )
        where: tuple[Any, ...] = tuple(int(i) for i in index)
        for a in (q, k, v):
            renew(a, where)
        touched = where
    elif part == "key/value head":
        head = data.draw(st.integers(0, dims.n_kv_heads - 1), label="kv head")
        renew(k, (..., head, slice(None), slice(None)))
        renew(v, (..., head, slice(None), slice(None)))
        touched = (..., slice(head * groups, (head + 1) * groups), slice(None), slice(None))
        renew(q, touched)
    else:
        head = data.draw(st.integers(0, dims.n_q_heads - 1), label="query head")
        touched = (..., head, slice(None), slice(None))
        renew(q, touched)
    other = problem.with_(q=q, k=k, v=v)
    out, out_other = kernel.output(problem), kernel.output(other)
    untouched = np.ones(out.shape, dtype=bool)
    untouched[touched] = False
    with replaying([("original", problem)], "out_original", compared=untouched):
        assert_identical(
            np.where(untouched, out_other, 0.0),
            np.where(untouched, out, 0.0),
            f"out of the other batch elements and heads after changing one {part} [SDPA-7.6]",
            other,
            kernel,
        )


def shift_limit(dtype: str) -> float:
    """The largest per-row bias shift |c| that bias-shift-invariance uses in ``dtype``.

    Biases lie on a grid of 1/8 in [-4, 4] and shifts on the same grid, |c| <= limit + 1.
    A power of two with 2 u_d (limit + 5) <= 1/8 keeps the bias's share of TOL-2's score
    errors (2 u_a |b| <= 2 u_d |b|) below 1/8, where the bound stays tight, and keeps b + c
    exact: (limit
    + 5) * 8 <= 1 / (2 u_d) is far less than 2**p = 2 / u_d multiples of 1/8.  4096 (beyond
    exp's range in float64) is enough for the rest.
    """
    room = 1.0 / (16 * UNIT_ROUNDOFF[dtype]) - 5
    return float(min(4096, 2 ** math.floor(math.log2(room))))


@register("bias-shift-invariance", "SDPA-7.6", applies=needs("bias"))
def bias_shift_invariance(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Adding a constant c_i to row i of the bias (up to 4096, beyond exp's range) changes
    the output by at most the sum of the two runs' TOL-2 bounds."""
    # A kernel taking the bias through its mask argument (PyTorch) gets no causal with it.
    causal = "never" if kernel.declaration.bias_shares_mask_argument else "maybe"
    problem = draw_problem(data, kernel, bias="always", causal=causal, tight=True)
    rng = draw_rng(data)
    bias = np.clip(np.round(rng.standard_normal(problem.required("bias").shape) * 8), -32, 32) / 8
    limit = shift_limit(problem.dtype)
    base = data.draw(st.sampled_from([limit, -limit, 0.0]), label="shift size")
    shifts = base + rng.integers(-8, 9, size=(*bias.shape[:-1], 1)) / 8
    original = problem.with_(bias=bias)
    shifted = original.with_(bias=bias + shifts)
    # One q for both runs, scaled for a bias at least as large as either run's (|b| + |c|),
    # so that both are inside TOL-2's domain.
    q = within_validity(kernel, original.with_(bias=np.abs(bias) + np.abs(shifts))).q
    original, shifted = original.with_(q=q), shifted.with_(q=q)
    _assert_unchanged(
        kernel,
        original,
        shifted,
        "out with a per-row constant added to the bias vs the original out [SDPA-7.6]",
    )


def _grid_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (2 * np.clip(np.round(rng.standard_normal(shape) * 2), -8, 7) + 1) / 4


@register("value-linearity", "SDPA-7.6")
def value_linearity(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """out(a V1 + b V2) equals a out(V1) + b out(V2) within the TOL-2 bounds of the
    three runs, tau3 + |a| tau1 + |b| tau2 (a V1 + b V2 is exact, so the definitions agree)."""
    problem = within_validity(kernel, draw_problem(data, kernel))
    rng = draw_rng(data)
    a = data.draw(st.sampled_from(LINEAR_COEFFICIENTS), label="a")
    b = data.draw(st.sampled_from(LINEAR_COEFFICIENTS), label="b")
    first = problem.with_(v=_grid_values(rng, problem.v.shape))
    second = problem.with_(v=_grid_values(rng, problem.v.shape))
    combined = problem.with_(v=a * first.v + b * second.v)
    out1, out2, out3 = kernel.output(first), kernel.output(second), kernel.output(combined)
    tolerance = (
        _tolerance(kernel, combined)
        + abs(a) * _tolerance(kernel, first)
        + abs(b) * _tolerance(kernel, second)
    )
    _assert_runs_agree(
        kernel,
        out3,
        a * out1 + b * out2,
        tolerance,
        f"out({a} V1 + {b} V2) vs {a} out(V1) + {b} out(V2) [SDPA-7.6]",
        combined,
        (
            [("v1", first), ("v2", second)],
            f"{a!r} * out_v1 + {b!r} * out_v2",
            f"{abs(a)!r} * bound(problem_v1) + {abs(b)!r} * bound(problem_v2)",
        ),
    )
