"""The conformance suite: every clause of the spec as a property, run against any kernel.

>>> from attnspec.conformance import check
>>> report = check("mypkg:my_attention", backend="torch", profile="quick")
>>> report.conforms
"""

from __future__ import annotations

from .api import SetupError, assert_conforms, check
from .assertions import assert_identical, assert_matches_reference, assert_within_bound
from .bounds import reference_bound, weights_bound
from .declaration import (
    KernelDeclaration,
    LinearClaim,
    RopeClaim,
    SparseClaim,
    declaration_of,
    declare,
)
from .failures import KernelRaised, PropertyFailure
from .kernel import KernelUnderTest, Problem
from .loading import KernelLoadError, load_kernel
from .runner import PROFILES, Report, Verdict

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
