"""Helpers whose names say what they assert; each raises a complete PropertyFailure."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np

from ...backends import Backend
from ..call.problem import Problem
from ..claims.declaration import KernelDeclaration
from ..draw.input_features import allowed_keys, scores_shape
from .bounds import reference_bound, weights_bound
from .failures import PropertyFailure
from .kernel import KernelUnderTest
from .reproduce import replaying


def unlike_array(backend: Backend, value: Any, shape: tuple[int, ...], dtype: str) -> str | None:
    """What a kernel returned, in words, when it is not one array of ``shape`` in ``dtype``
    on ``backend`` ("shape (...), dtype ..." or the name of its type); None when it is."""
    if not backend.is_array(value):
        return type(value).__name__
    if tuple(value.shape) != tuple(shape) or value.dtype != backend.dtype(dtype):
        return f"shape {tuple(value.shape)}, dtype {value.dtype}"
    return None


def first_index(where: np.ndarray) -> tuple[int, ...]:
    """Index of the first True element of ``where`` (for failure messages)."""
    return tuple(int(i) for i in np.argwhere(where)[0])


def assert_elements_within(
    name: str,
    got: np.ndarray,
    expected: np.ndarray,
    tolerance: np.ndarray,
    note: Callable[[tuple[int, ...]], str],
    tail: str = "",
    *,
    outside: np.ndarray | None = None,
    problem: Problem | None = None,
    kernel: KernelUnderTest | None = None,
) -> None:
    """A :class:`PropertyFailure` at the first element of ``got`` outside ``tolerance`` of
    ``expected`` (NaN counts as outside, an infinity equal to the one expected as within:
    a log-sum-exp of -inf, LSE-2; ``outside``, where given, says which are):
    ``name[at] = got, but should be expected within tolerance (note(at)); N of M elements
    outside`` and ``tail``.  Nothing when every element is within."""
    if outside is None:
        with np.errstate(invalid="ignore"):
            outside = ~((got == expected) | (np.abs(got - expected) <= tolerance))
    if not outside.any():
        return
    at = first_index(outside)
    raise PropertyFailure(
        f"{name}[{at}] = {got[at]!r}, but should be {expected[at]!r} within "
        f"{tolerance[at]:.3g} ({note(at)}); {int(outside.sum())} of "
        f"{outside.size} elements outside{tail}",
        problem,
        kernel,
    )


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
    judged = compared_rows(problem, kernel.declaration)
    assert_within_bound(
        keyless_rows_unjudged(kernel, judged, weights, expected),
        np.asarray(expected),
        np.asarray(tolerance),
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
    expected = np.asarray(bound.out)
    attends = np.asarray(bound.attends)[..., None]
    judged = keyless_rows_unjudged(kernel, attends, out, expected)
    assert_within_bound(judged, expected, np.asarray(bound.out_tolerance), what, problem, kernel)
    return out


def compared_rows(problem: Problem, declaration: KernelDeclaration) -> np.ndarray:
    """``(*batch, Hq, Lq, 1)``: rows whose output the spec fixes for this kernel.

    A row with no allowed key outputs 0 (SDPA-5.1) only for a kernel claiming that rule;
    for any other kernel its output is not compared (:func:`keyless_rows_unjudged`).
    """
    if declaration.empty_rows_zero:
        return np.ones((*scores_shape(problem)[:-1], 1), dtype=bool)
    return np.asarray(allowed_keys(problem, declaration).any(axis=-1, keepdims=True))


def keyless_rows_unjudged(
    kernel: KernelUnderTest,
    attends: Any,
    actual: np.ndarray,
    expected: Any,
    *,
    always: bool = False,
) -> np.ndarray:
    """``actual`` as the comparison with ``expected`` should see it: for a kernel that
    waives SDPA-5.1 (or ``always``), a row without an allowed key (``attends`` False,
    broadcastable to ``expected``) takes ``expected``'s values, so it is not judged.  SDPA-5.1
    is the one clause that fixes such a row, and a waived clause is not checked (CONF-7):
    not by its own property, nor by any other that meets such a row."""
    if kernel.declaration.empty_rows_zero and not always:
        return actual
    return np.where(np.broadcast_to(np.asarray(attends), np.shape(expected)), actual, expected)


def assert_same_result(
    kernel: KernelUnderTest,
    problem: Problem,
    actual: np.ndarray,
    expected: np.ndarray,
    what: str,
    *,
    keyless_rows: bool = True,
    replay: tuple[Sequence[tuple[str, Problem]], str] | None = None,
) -> None:
    """Two calls of the kernel whose definitions coincide (``problem``'s) agree within the
    sum of their TOL-2 bounds: each is within its bound of the one definition, and how
    close they are to it is SDPA-7.3's.  Rows without an allowed key are left out for a
    kernel that waives SDPA-5.1, as in :func:`assert_matches_reference`, and for every
    kernel unless ``keyless_rows`` (where the two calls empty them differently, which
    SDPA-5.1 governs).  ``replay``: the other calls (name, problem) and the expression
    of ``expected`` in their outputs, which the reproduction replays
    (:func:`.reproduce.replaying`)."""
    bound = reference_bound(problem, kernel.declaration)
    attends = np.asarray(bound.attends)[..., None]
    unjudged = not keyless_rows or not kernel.declaration.empty_rows_zero
    with (
        replaying(*replay, "bound(problem)", attends if unjudged else None)
        if replay
        else nullcontext()
    ):
        assert_shape(actual, expected.shape, what, problem, kernel)
        tolerance = 2 * np.asarray(bound.out_tolerance)
        assert_shape(actual, tolerance.shape, what, problem, kernel)
        actual = keyless_rows_unjudged(kernel, attends, actual, expected, always=not keyless_rows)
        assert_within_bound(actual, expected, tolerance, what, problem, kernel)
