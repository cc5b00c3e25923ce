"""The float64 definition and its TOL-2 bound for a conformance :class:`Problem`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...reference.serving import chunked_local_mask
from ...reference.tolerance import (
    ErrorBound,
    LseBound,
    dropout_error_bound,
    error_and_lse_bound,
    error_bound,
)
from ..call.problem import Problem
from ..claims.declaration import KernelDeclaration
from .kernel import identity_values


def reference_bound(
    problem: Problem,
    declaration: KernelDeclaration,
    *,
    weights: bool = False,
) -> ErrorBound:
    """SDPA-7.1 in float64 and the TOL-2 bound for ``problem`` as the kernel sees it.

    The causal alignment is the one the kernel declares (SDPA-4.1/4.2).  The weights
    (the size of the score matrix) are computed only when ``weights`` is True.
    """
    return error_bound(
        problem.q,
        problem.k,
        problem.v,
        **definition_keywords(problem, declaration.causal_alignment),
        weights=weights,
    )


def definition_keywords(
    problem: Problem, causal_alignment: str, *, features: bool = True
) -> dict[str, Any]:
    """The keywords of the reference's definition (and of its bounds) for ``problem``: the
    dtype, mask, bias, ``causal_alignment`` (the kernel's declared one, which anchors ALiBi
    too, ALIBI-2), scale and, with ``features``, softcap and the ALiBi slopes.  A chunk
    (CHUNK-1) is a mask: its allowed set at the same alignment joins the problem's mask."""
    mask = problem.mask
    if problem.chunk is not None:
        n_queries, n_keys = problem.q.shape[-2], problem.k.shape[-2]
        chunked = np.asarray(
            chunked_local_mask(n_queries, n_keys, problem.chunk, causal_alignment, xp=np)
        )
        mask = chunked if mask is None else np.logical_and(mask, chunked)
    keywords: dict[str, Any] = dict(
        dtype=problem.dtype,
        mask=mask,
        bias=problem.bias,
        is_causal=problem.is_causal,
        causal_alignment=causal_alignment,
        scale=problem.scale,
    )
    if features:
        keywords.update(softcap=problem.softcap, alibi_slopes=problem.alibi_slopes)
    return keywords


def lse_bound(problem: Problem, declaration: KernelDeclaration) -> tuple[ErrorBound, LseBound]:
    """The TOL-2 bound of the output and the log-sum-exp with its TOL-5 bound (LSE-1)."""
    return error_and_lse_bound(
        problem.q,
        problem.k,
        problem.v,
        **definition_keywords(problem, declaration.causal_alignment),
        weights=False,
    )


def dropout_bound(
    problem: Problem,
    declaration: KernelDeclaration,
    keep: Any,
) -> tuple[Any, Any]:
    """DROP-2's output for the keep indicators ``keep`` and its TOL-6 bound."""
    return dropout_error_bound(
        problem.q,
        problem.k,
        problem.v,
        **definition_keywords(problem, declaration.causal_alignment),
        dropout_p=problem.dropout_p,
        dropout_keep=keep,
    )


def weights_bound(problem: Problem, declaration: KernelDeclaration) -> tuple[Any, Any]:
    """(weights, tolerance) matching how ``KernelUnderTest.output_with_weights`` observes them.

    Returned weights get the weights bound of TOL-2; weights observed through V = I are
    outputs, so they get :func:`observed_weights_bound`.
    """
    if declaration.returns_weights:
        bound = reference_bound(problem, declaration, weights=True)
        return bound.weights, bound.weights_tolerance
    return observed_weights_bound(problem, declaration)


def observed_weights_bound(problem: Problem, declaration: KernelDeclaration) -> tuple[Any, Any]:
    """(weights, tolerance) of weights observed through V = I
    (``KernelUnderTest.observed_weights``): the output and output bound (TOL-2) of the
    V = I problem.

    They hold as well for weights observed in column blocks V_j = I[:, j:j + Ev]: TOL-2
    bounds output column c from column c of V alone (its sums over keys of v_jc, |v_jc|,
    v_jc^2 and its hull over keys; the weights and score errors do not depend on V), so
    block column c, column j + c of I, gets the bound of column j + c of the one V = I
    call, to the bit (tests/conformance/test_observed_weights.py checks it).
    """
    bound = reference_bound(identity_values(problem), declaration)
    return bound.out, bound.out_tolerance
