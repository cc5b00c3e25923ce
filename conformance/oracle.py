"""The float64 definition and its TOL-2 bound for a conformance :class:`Problem`."""

from __future__ import annotations

from typing import Any

from ..reference.tolerance import ErrorBound, error_bound
from .declaration import KernelDeclaration
from .kernel import Problem, identity_values


def reference_bound(
    problem: Problem, declaration: KernelDeclaration, *, weights: bool = False,
) -> ErrorBound:
    """SDPA-7.1 in float64 and the TOL-2 bound for ``problem`` as the kernel sees it.

    The causal alignment is the one the kernel declares (SDPA-4.1/4.2).  The weights
    (the size of the score matrix) are computed only when ``weights`` is True.
    """
    return error_bound(
        problem.q, problem.k, problem.v,
        dtype=problem.dtype, mask=problem.mask, bias=problem.bias,
        is_causal=problem.is_causal, causal_alignment=declaration.causal_alignment,
        scale=problem.scale, weights=weights,
    )


def weights_bound(problem: Problem, declaration: KernelDeclaration) -> tuple[Any, Any]:
    """(weights, tolerance) matching how ``KernelUnderTest.run_with_weights`` observes them.

    Returned weights get the weights bound of TOL-2; weights observed through V = I are
    outputs, so they get the output bound of that V = I problem.
    """
    if declaration.returns_weights:
        bound = reference_bound(problem, declaration, weights=True)
        return bound.weights, bound.weights_tolerance
    bound = reference_bound(identity_values(problem), declaration)
    return bound.out, bound.out_tolerance
