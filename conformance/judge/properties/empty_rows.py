"""SDPA-5: a row with no allowed key, and Lk = 0, give exactly 0 — not mean(V), not NaN."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ...call.problem import Problem
from ...claims.declaration import KernelDeclaration
from ...draw.input_features import allowed_keys
from ...draw.sizes import refit
from ...draw.strategies import draw_dims, draw_problem
from ..assertions import first_index
from ..failures import PropertyFailure
from ..kernel import KernelUnderTest
from ..registration import dense_only, register
from ._helpers import assert_output_shapes


def empty_row_routes(declaration: KernelDeclaration) -> list[str]:
    """The claimed ways to give a query no allowed key: an all-False mask row, a row of
    -inf bias (SDPA-3.3), or bottom-right causal with Lq > Lk (SDPA-4.3)."""
    routes = []
    if declaration.mask:
        routes.append("mask")
    if declaration.bias:
        routes.append("bias")
    if declaration.causal and declaration.causal_alignment == "bottom_right":
        routes.append("causal")
    return routes


def claims_empty_rows(declaration: KernelDeclaration) -> str | None:
    """Applicable to dense kernels that claim the fully-masked-row rule and can express
    a row without allowed keys."""
    reason = dense_only(declaration)
    if reason is None and not declaration.empty_rows_zero:
        reason = "the kernel does not claim the fully-masked-row rule (empty_rows_zero)"
    if reason is None and not empty_row_routes(declaration):
        reason = "the kernel claims no mask, no bias and no bottom-right causal rule"
    return reason


def assert_zero_rows(
    values: np.ndarray,
    rows: np.ndarray,
    what: str,
    problem: Problem,
    kernel: KernelUnderTest,
    *,
    shows_weights: bool = False,
) -> None:
    """``values[..., i, :]`` is exactly 0 wherever ``rows[..., i]`` is True (``shows_weights``:
    they are weights observed through V = I, see :class:`PropertyFailure`)."""
    wrong = rows[..., None] & ~(values == 0)
    if wrong.any():
        at = first_index(wrong)
        row = values[at[:-1]]
        if np.isnan(row).any():
            looks = "NaN, as a softmax over an all -inf row gives"
        elif what == "weights" and np.ptp(row) == 0:
            looks = "uniform: mean(V), as a finite mask fill gives"
        else:
            looks = "nonzero; a finite mask fill, giving mean(V), is the usual cause"
        raise PropertyFailure(
            f"{what}{at} = {float(values[at])!r} in a row with no allowed key, but should be "
            f"exactly 0 (the row is {looks}); {int(wrong.sum())} elements of such rows "
            f"are not 0 [SDPA-5.1]",
            problem,
            kernel,
            shows_weights=shows_weights,
        )


@register("empty-rows-zero", "SDPA-5.1", applies=claims_empty_rows)
def empty_rows_zero(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Rows whose keys are all masked (all-False mask row, all -inf bias row, or
    bottom-right causal rows with Lq > Lk) give exactly 0 output and exactly 0 weights."""
    decl = kernel.declaration
    route = data.draw(st.sampled_from(empty_row_routes(decl)), label="empty row by")
    if route == "causal":
        dims = draw_dims(data, kernel, weights=True)
        extra = data.draw(st.integers(1, 4), label="Lq - Lk")
        dims = refit(replace(dims, n_queries=dims.n_keys + extra), weights=True)
        problem = draw_problem(data, kernel, dims=dims, causal="always")
    else:
        dims = draw_dims(data, kernel, min_queries=1, min_keys=1, weights=True)
        causal = "maybe" if decl.mask_and_causal and route == "mask" else "never"
        route_always: dict[str, Any] = {route: "always"}
        problem = draw_problem(data, kernel, dims=dims, causal=causal, **route_always)
        row = data.draw(st.integers(0, dims.n_queries - 1), label="emptied row")
        # a padding mask or bias may broadcast over the queries: give it its query axis
        values = getattr(problem, route)
        values = np.broadcast_to(
            values, (*values.shape[:-2], dims.n_queries, values.shape[-1])
        ).copy()
        values[..., row, :] = False if route == "mask" else -np.inf
        setattr(problem, route, values)
    empty = np.asarray(~allowed_keys(problem, decl).any(axis=-1))
    out, weights = kernel.output_with_weights(problem)
    assert_zero_rows(out, empty, "out", problem, kernel)
    assert_zero_rows(
        weights, empty, "weights", problem, kernel, shows_weights=kernel.observes_weights
    )


@register("no-keys-zero", "SDPA-5.2")
def no_keys_zero(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """Lk = 0 gives an output of zeros of shape (*batch, Hq, Lq, Ev), with and without
    the mask, bias and causal rule the kernel claims."""
    dims = replace(draw_dims(data, kernel, min_queries=1), n_keys=0)
    problem = draw_problem(data, kernel, dims=dims)
    out, weights = kernel.call_on(problem)
    assert_output_shapes(kernel, problem, out, weights)
    out = kernel.numpy(out)
    wrong = ~(out == 0)
    if wrong.any():
        at = first_index(wrong)
        raise PropertyFailure(
            f"out{at} = {float(out[at])!r} with Lk = 0, but should be exactly 0 "
            f"({int(wrong.sum())} of {wrong.size} elements are not) [SDPA-5.2]",
            problem,
            kernel,
        )
