"""The conformance suite: every clause of the spec as a property, run against any kernel.

>>> from attnspec.conformance import check
>>> report = check("mypkg:my_attention", backend="torch", profile="quick")
>>> report.conforms
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..backends import Backend, get_backend
from .api import SetupError, assert_conforms
from .assertions import assert_identical, assert_matches_reference, assert_within_bound
from .declaration import KernelDeclaration, LinearClaim, SparseClaim, declaration_of, declare
from .failures import KernelRaised, PropertyFailure
from .kernel import KernelLoadError, KernelUnderTest, Problem, load_kernel
from .oracle import reference_bound, weights_bound
from .runner import PROFILES, Report, Verdict, run_all

__all__ = [
    "PROFILES",
    "KernelDeclaration",
    "KernelLoadError",
    "KernelRaised",
    "KernelUnderTest",
    "LinearClaim",
    "Problem",
    "PropertyFailure",
    "Report",
    "SetupError",
    "SparseClaim",
    "Verdict",
    "assert_conforms",
    "assert_identical",
    "assert_matches_reference",
    "assert_within_bound",
    "check",
    "declaration_of",
    "declare",
    "load_kernel",
    "reference_bound",
    "weights_bound",
]


def check(
    kernel: str | Callable[..., Any],
    *,
    backend: str | Backend | None = None,
    device: Any = None,
    profile: str = "quick",
    seed: int | None = None,
    only: Iterable[str] | None = None,
    skip: Iterable[str] | None = None,
    strict: bool = False,
    **claims: Any,
) -> Report:
    """Check ``kernel`` (a callable or ``"MODULE:FUNC"``) clause by clause.

    ``claims`` override fields of the kernel's :class:`KernelDeclaration`.
    """
    if isinstance(backend, Backend):
        chosen = backend
    elif backend is None and device is None:
        chosen = get_backend()
    else:
        chosen = Backend(backend or get_backend().name, device)
    if isinstance(kernel, str):
        under_test = KernelUnderTest.load(kernel, chosen, **claims)
    else:
        under_test = KernelUnderTest(kernel, chosen, declaration_of(kernel, **claims))
    return run_all(under_test, profile=profile, seed=seed, only=only, skip=skip, strict=strict)
