"""The conformance suite: every clause of the spec as a property, run against any kernel.

>>> from attnspec.conformance import check
>>> report = check("mypkg:my_attention", backend="torch", profile="quick")
>>> report.conforms

The front ends live here (``api``, ``cli``, ``pytest_plugin``, ``matrix``, and ``plan``, the one
run loop they share); the layers below are folders, lowest first: ``claims/``, ``call/``,
``kernels/``, ``draw/``, ``judge/``, ``run/``, ``report/``.  Each folder's ``__init__`` says
what it owns and what it may import (``tests/test_architecture.py`` enforces it).

May import: report, benchmarks.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # the facade: each public name from the module that defines or exports it (declaration.py
    # exports the family claims beside KernelDeclaration, as its fields' types)
    from .api import SetupError, assert_conforms, check
    from .call.problem import Problem
    from .claims.declaration import (
        Fp8Claim,
        KernelDeclaration,
        LinearClaim,
        MergeClaim,
        MlaClaim,
        PagedBatchClaim,
        RecurrentClaim,
        RopeClaim,
        SparseClaim,
        declaration_of,
        declare,
    )
    from .claims.loading import KernelLoadError, load_kernel
    from .judge.assertions import assert_identical, assert_matches_reference, assert_within_bound
    from .judge.bounds import reference_bound, weights_bound
    from .judge.failures import KernelRaised, PropertyFailure
    from .judge.kernel import KernelUnderTest
    from .judge.verdict import Report, Verdict
    from .run.property_runner import PROFILES

__all__ = [
    "PROFILES",
    "Fp8Claim",
    "KernelDeclaration",
    "KernelLoadError",
    "KernelRaised",
    "KernelUnderTest",
    "LinearClaim",
    "MergeClaim",
    "MlaClaim",
    "PagedBatchClaim",
    "Problem",
    "PropertyFailure",
    "RecurrentClaim",
    "Report",
    "RopeClaim",
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

# The facade's names are imported at their first use (PEP 562), each from the module the
# imports above name: a process that needs part of the suite only (a kernel's own process,
# run/kernel_process.py, which calls the kernel and draws nothing) does not import all of
# it, Hypothesis and every property among them: ~0.15 s of CPU a process, and a check
# starts one or more.
_HOME = {
    name: module
    for module, names in (
        (".api", "SetupError assert_conforms check"),
        (".call.problem", "Problem"),
        (".claims.declaration", "Fp8Claim KernelDeclaration LinearClaim MergeClaim MlaClaim"),
        (".claims.declaration", "PagedBatchClaim RecurrentClaim RopeClaim SparseClaim"),
        (".claims.declaration", "declaration_of declare"),
        (".claims.loading", "KernelLoadError load_kernel"),
        (".judge.assertions", "assert_identical assert_matches_reference assert_within_bound"),
        (".judge.bounds", "reference_bound weights_bound"),
        (".judge.failures", "KernelRaised PropertyFailure"),
        (".judge.kernel", "KernelUnderTest"),
        (".judge.verdict", "Report Verdict"),
        (".run.property_runner", "PROFILES"),
    )
    for name in names.split()
}


def __getattr__(name: str) -> Any:
    """A name of the facade, imported from its module at its first use (then kept here)."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_HOME[name], __name__), name)
    globals()[name] = value
    return value
