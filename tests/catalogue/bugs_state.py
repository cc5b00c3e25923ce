"""Buggy kernels whose results depend on earlier calls (SDPA-7.8, issue 29), with evidence.

Each is the definition of :mod:`catalogue.feature_blocks` plus state: a term cached on the
input shapes alone (ALiBi bias, softcap, mask), or a fault that depends on how many times
the kernel has been called.  Each entry's evidence calls the kernel as the bug needs
(twice at one shape, or N times) and compares with the reference; it makes a fresh kernel
for that (:func:`fresh`), so the counts of other tests do not matter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from attnspec.conformance import declare
from attnspec.conformance.call.problem import Problem
from attnspec.conformance.judge.bounds import reference_bound
from attnspec.conformance.judge.kernel import KernelUnderTest

from .blocks import named
from .feature_blocks import Features, arranged, attend_features
from .features_catalogue import FeatureBug, _outside, _problem

Array = np.ndarray
Mask = Array | None
# the call after which wrong_after_many_calls goes wrong, and wrong_every_nth_call's period
AFTER_CALLS = 3000
EVERY_NTH_CALL = 50


def _cached_by_shape(name: str, doc: str, argument: str, **claims: Any) -> Callable[..., Any]:
    """The definition, but ``argument`` (alibi_slopes, softcap or mask) is the one of the
    first call of each input shape: a cache keyed on the shapes alone."""
    cache: dict[tuple[tuple[int, ...], ...], Any] = {}

    @declare(bias=True, gqa=True, **claims)
    def kernel(
        q: Array,
        k: Array,
        v: Array,
        *,
        mask: Mask = None,
        bias: Mask = None,
        is_causal: bool = False,
        scale: float | None = None,
        softcap: float | None = None,
        alibi_slopes: Array | None = None,
    ) -> Array:
        given = {"mask": mask, "softcap": softcap, "alibi_slopes": alibi_slopes}
        if given[argument] is not None:  # the first value given at these shapes, kept
            given[argument] = cache.setdefault((q.shape, k.shape, v.shape), given[argument])
        f = Features(softcap=given["softcap"], alibi_slopes=given["alibi_slopes"])
        return attend_features(arranged(q, k, v, given["mask"], bias, is_causal, scale, f), f)

    kernel.cache = cache  # type: ignore[attr-defined]
    return named(kernel, name, doc)


alibi_cached_by_shape = _cached_by_shape(
    "alibi_cached_by_shape",
    "Computes the ALiBi slopes' bias once per input shape and reuses it: a later call of the "
    "same shape with other slopes gets the first call's bias.",
    "alibi_slopes",
    alibi=True,
)
softcap_cached_by_shape = _cached_by_shape(
    "softcap_cached_by_shape",
    "Builds its softcapped score function once per input shape: a later call of the same "
    "shape with another cap is capped at the first call's.",
    "softcap",
    softcap=True,
)
mask_cached_by_shape = _cached_by_shape(
    "mask_cached_by_shape",
    "Converts the boolean mask once per input shape and reuses it: a later call of the same "
    "shape with another mask attends the first call's keys.",
    "mask",
)


def counting(name: str, doc: str, wrong: Callable[[int], bool]) -> Callable[..., Any]:
    """The definition, but call number n (from 1) returns the output times 1.5 (and plus
    one, so zero outputs change too) where ``wrong(n)``."""
    calls = [0]

    @declare(bias=True, gqa=True)
    def kernel(
        q: Array,
        k: Array,
        v: Array,
        *,
        mask: Mask = None,
        bias: Mask = None,
        is_causal: bool = False,
        scale: float | None = None,
    ) -> Array:
        calls[0] += 1
        f = Features()
        out = attend_features(arranged(q, k, v, mask, bias, is_causal, scale, f), f)
        if wrong(calls[0]):
            out = (out * 1.5 + 1).astype(out.dtype)
        return out

    kernel.calls = calls  # type: ignore[attr-defined]
    return named(kernel, name, doc)


wrong_every_50th_call = counting(
    "wrong_every_50th_call",
    f"Right on every call but every {EVERY_NTH_CALL}th (a race on a reused buffer, a "
    "periodic flush): 2 % of its calls are wrong.",
    lambda n: n % EVERY_NTH_CALL == 0,
)
wrong_after_3000_calls = counting(
    "wrong_after_3000_calls",
    f"Right for its first {AFTER_CALLS} calls, wrong from then on (a leak, a counter that "
    "wraps, a pool that runs dry).",
    lambda n: n > AFTER_CALLS,
)


def _second_call_differs(first: Problem, second: Problem) -> Callable[[KernelUnderTest], Any]:
    """Evidence: after a call on ``first``, a call on ``second`` (the same shapes, another
    argument) departs from the definition beyond TOL-2."""

    def evidence(kernel: KernelUnderTest) -> str | None:
        fresh(kernel.fn)
        kernel.output(first)
        out = kernel.output(second)
        fresh(kernel.fn)  # as it was: the property's run starts from no state too
        bound = reference_bound(second, kernel.declaration)
        return _outside(out, np.asarray(bound.out), np.asarray(bound.out_tolerance), "out")

    return evidence


def _call_differs(calls: int) -> Callable[[KernelUnderTest], Any]:
    """Evidence: on a fresh count, call ``calls`` of one problem departs from the definition
    beyond TOL-2 (the earlier ones are not looked at)."""

    def evidence(kernel: KernelUnderTest) -> str | None:
        problem = _problem()
        fresh(kernel.fn)
        for _ in range(calls - 1):
            kernel.fn(problem.q, problem.k, problem.v)
        out = kernel.output(problem)
        fresh(kernel.fn)  # as it was: the property's run starts from a count of 0 too
        bound = reference_bound(problem, kernel.declaration)
        return _outside(out, np.asarray(bound.out), np.asarray(bound.out_tolerance), "out")

    return evidence


def fresh(fn: Callable[..., Any]) -> None:
    """Forget ``fn``'s state (its cache or its call count), as a new process would."""
    if hasattr(fn, "cache"):
        fn.cache.clear()
    if hasattr(fn, "calls"):
        fn.calls[0] = 0


_MASK_A = np.ones((5, 7), dtype=bool)
_MASK_B = np.tril(np.ones((5, 7), dtype=bool))
_SLOPES = np.asarray([0.5, 0.25, 0.125, 0.0625])

STATE_CATALOGUE = [
    FeatureBug(
        "alibi-cached-by-shape",
        alibi_cached_by_shape,
        "same-shape-new-arguments",
        _second_call_differs(
            _problem(alibi_slopes=_SLOPES), _problem(seed=1, alibi_slopes=4 * _SLOPES)
        ),
    ),
    FeatureBug(
        "softcap-cached-by-shape",
        softcap_cached_by_shape,
        "same-shape-new-arguments",
        _second_call_differs(
            _problem(magnitude=3.0, softcap=8.0), _problem(seed=1, magnitude=3.0, softcap=1.0)
        ),
    ),
    FeatureBug(
        "mask-cached-by-shape",
        mask_cached_by_shape,
        "same-shape-new-arguments",
        _second_call_differs(_problem(mask=_MASK_A), _problem(seed=1, mask=_MASK_B)),
    ),
    FeatureBug(
        "wrong-every-50th-call",
        wrong_every_50th_call,
        "many-calls",
        _call_differs(EVERY_NTH_CALL),
    ),
    FeatureBug(
        "wrong-after-3000-calls",
        wrong_after_3000_calls,
        "many-calls",
        _call_differs(AFTER_CALLS + 1),
        known_miss=(
            "the quick profile makes 160 calls of many-calls (CALLS_PER_SMALL_EXAMPLE x 20 "
            "small examples), the default one 800: fewer than 3000; the thorough one's 8000 "
            "catch it (tests/catalogue/test_state.py)"
        ),
    ),
]
