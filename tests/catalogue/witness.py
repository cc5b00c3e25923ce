"""Is a catalogued bug really a bug?  A direct check, independent of the conformance suite.

Runs a buggy kernel on its witness (a suite ``Problem``) and compares with the
reference (``attnspec.reference``) and its TOL-2 bound: a difference is a raised error
the reference does not raise (or the reverse), modified inputs, a wrong dtype or shape,
different bits on repeated calls, or a value outside TOL-2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnspec.backends import Backend
from attnspec.conformance import declaration_of
from attnspec.reference.tolerance import error_bound

from .buggy import BuggyKernel

REPEATS = 5  # enough calls that a random summation order shows with near certainty


def _transposed_view(a: Any) -> Any:
    """The same values as ``a`` in a non-contiguous (transposed-storage) NumPy view."""
    return np.swapaxes(np.ascontiguousarray(np.swapaxes(a, -1, -2)), -1, -2)


def difference_outside_tol2(
    actual: np.ndarray, expected: np.ndarray, tolerance: np.ndarray
) -> str | None:
    """Where ``actual`` departs from the reference: another shape, a non-finite value
    that is not the reference's bit for bit (TOL-3), or a finite one outside TOL-2."""
    if actual.shape != expected.shape:
        return f"shape {actual.shape}, the reference's is {expected.shape}"
    finite = np.isfinite(expected)
    same_nonfinite = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
    if (~finite & ~same_nonfinite).any():
        at = tuple(int(i) for i in np.argwhere(~finite & ~same_nonfinite)[0])
        return f"out{at} = {float(actual[at])!r}, the reference's is {float(expected[at])!r}"
    with np.errstate(invalid="ignore"):
        outside = finite & ~(np.abs(actual - expected) <= tolerance)
    if outside.any():
        at = tuple(int(i) for i in np.argwhere(outside)[0])
        return (
            f"out{at} = {float(actual[at])!r}, the reference's is {float(expected[at])!r} "
            f"(TOL-2 allows {tolerance[at]:.3g})"
        )
    return None


def observed_difference(bug: BuggyKernel) -> str | None:
    """How ``bug`` visibly departs from the reference on its witness, or None."""
    if hasattr(bug, "observed_difference"):  # feature entries carry their own evidence
        return bug.observed_difference()
    w = bug.witness
    backend = Backend(bug.backend)
    declaration = declaration_of(bug.fn)

    def rounded(a: np.ndarray) -> np.ndarray:
        return backend.to_numpy(backend.asarray(a, w.dtype)).astype(np.float64)

    q, k, v = rounded(w.q), rounded(w.k), rounded(w.v)
    bias = None if w.bias is None else rounded(w.bias)
    try:
        bound = error_bound(
            q,
            k,
            v,
            dtype=w.dtype,
            mask=w.mask,
            bias=bias,
            is_causal=w.is_causal,
            causal_alignment=declaration.causal_alignment,
            scale=w.scale,
        )
    except ValueError as exc:
        bound, rejection = None, exc

    args = [backend.asarray(a, w.dtype) for a in (q, k, v)]
    if bug.strided_witness:
        args = [_transposed_view(a) for a in args]
    kwargs: dict[str, Any] = {"is_causal": w.is_causal, "scale": w.scale}
    if w.mask is not None:
        kwargs["mask"] = backend.asarray(w.mask)
    if bias is not None:
        kwargs["bias"] = backend.asarray(bias, w.dtype)
    before = [backend.to_numpy(a).copy() for a in args]
    try:
        results = [bug.fn(*args, **kwargs) for _ in range(REPEATS)]
    except Exception as exc:
        return None if bound is None else f"raised {type(exc).__name__}: {exc}"
    if bound is None:
        return f"returned a result where the reference raises ValueError: {rejection}"
    for name, old, new in zip("qkv", before, args, strict=True):
        if not np.array_equal(old, backend.to_numpy(new), equal_nan=True):
            return f"modified its input {name}"
    outs = [r[0] if declaration.returns_weights else r for r in results]
    if outs[0].dtype != backend.dtype(w.dtype):
        return f"output dtype {outs[0].dtype} for {w.dtype} inputs"
    values = [backend.to_numpy(o).astype(np.float64) for o in outs]
    for again in values[1:]:
        if not np.array_equal(values[0], again, equal_nan=True):
            return "different bits on repeated identical calls"
    return difference_outside_tol2(
        values[0], np.asarray(bound.out), np.asarray(bound.out_tolerance)
    )
