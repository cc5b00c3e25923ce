"""Helpers whose names say what they assert; each raises a complete PropertyFailure."""

from __future__ import annotations

from typing import Any

import numpy as np

from .bounds import reference_bound, weights_bound
from .failures import PropertyFailure
from .input_features import allowed_keys
from .kernel import KernelUnderTest, Problem


def first_index(where: np.ndarray) -> tuple[int, ...]:
    """Index of the first True element of ``where`` (for failure messages)."""
    return tuple(int(i) for i in np.argwhere(where)[0])


def assert_shape(
    actual: np.ndarray,
    expected: tuple[int, ...],
    what: str,
    problem: Problem,
    kernel: KernelUnderTest,
) -> None:
    if tuple(actual.shape) != tuple(expected):
        raise PropertyFailure(
            f"{what}.shape={tuple(actual.shape)}, but should be {tuple(expected)}", problem, kernel
        )


def assert_identical(
    actual: np.ndarray,
    expected: np.ndarray,
    what: str,
    problem: Problem,
    kernel: KernelUnderTest,
) -> None:
    """Equal values everywhere (IEEE ==, NaN matching NaN, +0 == -0)."""
    assert_shape(actual, expected.shape, what, problem, kernel)
    same = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
    if not same.all():
        at = first_index(~same)
        raise PropertyFailure(
            f"{what} differs at {at}: {float(actual[at])!r} vs {float(expected[at])!r} "
            f"({int((~same).sum())} of {same.size} elements differ)",
            problem,
            kernel,
        )


def assert_within_bound(
    actual: np.ndarray,
    expected: np.ndarray,
    bound: np.ndarray,
    what: str,
    problem: Problem,
    kernel: KernelUnderTest,
    clause: str = "TOL-2",
    *,
    shows_weights: bool = False,
) -> None:
    """|actual - expected| <= bound elementwise; non-finite expected values must match.

    ``clause`` names the bound in the message (TOL-2, or LIN-5.2 for linear attention);
    ``shows_weights``: ``actual`` holds weights observed through V = I (the reproduction
    prints them, see :class:`PropertyFailure`).
    """
    assert_shape(actual, expected.shape, what, problem, kernel)
    finite = np.isfinite(expected)
    exact = ~finite
    mismatched_nonfinite = exact & ~((actual == expected) | (np.isnan(actual) & np.isnan(expected)))
    with np.errstate(invalid="ignore"):
        error = np.where(finite, np.abs(actual - expected), 0.0)
        too_far = finite & ~(error <= bound)
    if mismatched_nonfinite.any():
        at = first_index(mismatched_nonfinite)
        raise PropertyFailure(
            f"{what}[{at}] = {float(actual[at])!r}, but should be {float(expected[at])!r} (TOL-3)",
            problem,
            kernel,
            shows_weights=shows_weights,
        )
    if too_far.any():
        ratio = np.where(too_far, error / np.maximum(bound, np.finfo(np.float64).tiny), 0.0)
        worst = ratio == ratio.max() if np.isfinite(ratio).all() else too_far
        at = first_index(worst)
        if not np.isfinite(actual[at]):
            raise PropertyFailure(
                f"{what}[{at}] = {float(actual[at])!r}, but should be finite: "
                f"{float(expected[at])!r} within {bound[at]:.3g} ({clause}); "
                f"{int(too_far.sum())} of {too_far.size} elements outside",
                problem,
                kernel,
                shows_weights=shows_weights,
            )
        raise PropertyFailure(
            f"{what}[{at}] = {float(actual[at])!r}, but should be {float(expected[at])!r} within "
            f"{bound[at]:.3g} ({clause}); error {error[at]:.3g} is {error[at] / bound[at]:.3g}x "
            f"the bound; {int(too_far.sum())} of {too_far.size} elements outside",
            problem,
            kernel,
            shows_weights=shows_weights,
        )


def assert_weights_match(kernel: KernelUnderTest, problem: Problem, weights: np.ndarray) -> None:
    """Weights from :meth:`KernelUnderTest.output_with_weights` within TOL-2 of the
    definition's (returned ones within the weights bound, observed ones within the V = I
    output bound: :func:`.bounds.weights_bound`); a failure on observed weights reproduces
    them.  Rows without an allowed key are left out for a kernel that waives SDPA-5.1."""
    expected, tolerance = weights_bound(problem, kernel.declaration)
    attends = allowed_keys(problem, kernel.declaration).any(axis=-1)
    expected, tolerance = _keyless_rows_unjudged(kernel, attends, weights, expected, tolerance)
    assert_within_bound(
        weights,
        expected,
        tolerance,
        "weights",
        problem,
        kernel,
        shows_weights=kernel.observes_weights,
    )


def assert_matches_reference(
    kernel: KernelUnderTest,
    problem: Problem,
    out: np.ndarray | None = None,
    what: str = "out",
) -> np.ndarray:
    """The kernel's output lies within TOL-2 of the float64 definition (SDPA-7.3)."""
    if out is None:
        out = kernel.output(problem)
    bound = reference_bound(problem, kernel.declaration)
    assert_shape(out, tuple(np.shape(bound.out)), what, problem, kernel)
    expected, tolerance = _keyless_rows_unjudged(
        kernel, bound.attends, out, bound.out, bound.out_tolerance
    )
    assert_within_bound(out, expected, tolerance, what, problem, kernel)
    return out


def _keyless_rows_unjudged(
    kernel: KernelUnderTest, attends: Any, actual: np.ndarray, expected: Any, tolerance: Any
) -> tuple[np.ndarray, np.ndarray]:
    """``expected`` and ``tolerance`` as NumPy arrays, but for a kernel that declares it
    does not follow SDPA-5.1: there a row without an allowed key (``attends`` False) is not
    judged (expected ``actual``, any distance)."""
    expected, tolerance = np.asarray(expected), np.asarray(tolerance)
    if kernel.declaration.empty_rows_zero:
        return expected, tolerance
    empty = np.broadcast_to(~np.asarray(attends)[..., None], expected.shape)
    return np.where(empty, actual, expected), np.where(empty, np.inf, tolerance)


def assert_same_result(
    kernel: KernelUnderTest,
    problem: Problem,
    actual: np.ndarray,
    expected: np.ndarray,
    what: str,
    *,
    keyless_rows: bool = True,
) -> None:
    """Two calls of the kernel whose definitions coincide (``problem``'s) agree within the
    sum of their TOL-2 bounds: each is within its bound of the one definition, and how
    close they are to it is SDPA-7.3's.  Rows without an allowed key are left out for a
    kernel that waives SDPA-5.1, as in :func:`assert_matches_reference`, and for every
    kernel unless ``keyless_rows`` (where the two calls empty them differently, which
    SDPA-5.1 governs)."""
    assert_shape(actual, expected.shape, what, problem, kernel)
    bound = reference_bound(problem, kernel.declaration)
    tolerance = 2 * np.asarray(bound.out_tolerance)
    assert_shape(actual, tolerance.shape, what, problem, kernel)
    if not (keyless_rows and kernel.declaration.empty_rows_zero):
        empty = np.broadcast_to(~np.asarray(bound.attends)[..., None], expected.shape)
        actual = np.where(empty, expected, actual)
    assert_within_bound(actual, expected, tolerance, what, problem, kernel)
