"""Failure reports that show the inputs, the measured error and the clause.

The reproduction of a failure is written on demand by :func:`.reproduce.failure_snippet`
(while Hypothesis shrinks, most failures are never reported, and realistic inputs are large).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Protocol

from ..call.problem import Problem
from ..claims.declaration import KernelDeclaration


class NamedBackend(Protocol):
    """The backend a kernel ran on, as a failure names it."""

    @property
    def name(self) -> str: ...


class ShownKernel(Protocol):
    """The kernel as a failure shows it: what it was called with (``describe``) and how
    a reproduction rebuilds it.  The judge's ``KernelUnderTest`` and the ``KernelInfo``
    of a kernel loaded in another process are both one."""

    @property
    def target(self) -> str: ...

    @property
    def loader(self) -> str: ...

    @property
    def declaration(self) -> KernelDeclaration: ...

    @property
    def backend(self) -> NamedBackend: ...

    def describe(self, problem: Problem) -> str: ...


_NUMPY_SCALAR = re.compile(r"np\.(float\d+|int\d+|uint\d+|bool_?|str_)\(([^()]*)\)")


class PropertyFailure(AssertionError):
    """A property does not hold; the message is complete and self-contained.

    ``shows_weights``: the finding is about weights observed through V = I
    (``KernelUnderTest.observed_weights``), which the reproduction then prints too.
    ``explain``: a probe that names the failure's cause by calling the kernel again (BWD-14's
    float32 re-run); it runs on the reported failure only (:func:`with_cause`), as the
    reproduction is written, not on every failing example Hypothesis tries while it shrinks.
    """

    def __init__(
        self,
        finding: str,
        problem: Problem | None = None,
        kernel: ShownKernel | None = None,
        *,
        hint: str = "",
        shows_weights: bool = False,
        explain: Callable[[], str] | None = None,
    ) -> None:
        # NumPy 2 scalar reprs (np.float64(0.5)) are noise in a message: show the value
        self.finding = finding = _NUMPY_SCALAR.sub(r"\2", finding)
        self.problem = problem
        self.hint = hint
        self.shows_weights = shows_weights
        self.explain = explain
        self.kernel = kernel  # what the reproduction (reproduce.failure_snippet) calls
        self.counterexample = (
            ""
            if problem is None
            else kernel.describe(problem)
            if kernel is not None
            else problem.describe()
        )
        message = finding
        if self.counterexample:
            message += f"\n  inputs: {self.counterexample}"
        super().__init__(message)


def with_cause(failure: PropertyFailure) -> PropertyFailure:
    """``failure`` as reported: what its ``explain`` probe says ("" for no cause) appended to
    its finding, the probe run once (then dropped).  A probe that raises, or whose kernel
    crashes, exits or hangs, names no cause: it is advice, the finding already says what
    failed (as a hint is, ``convention_hints.run_hints``)."""
    explain, failure.explain = failure.explain, None
    if explain is not None:
        try:
            failure.finding += explain()
        except (Exception, KernelExited):
            pass
    return failure


def distinct(found: float, expected: float) -> tuple[str, str]:
    """``found`` and ``expected`` with as many significant digits (6 to 17) as it takes to
    tell them apart, so a message never reads "0.57735, but should be 0.57735"."""
    for digits in range(6, 18):
        shown = f"{found:.{digits}g}", f"{expected:.{digits}g}"
        if shown[0] != shown[1]:
            return shown
    return repr(found), repr(expected)


# How a KernelRaised finding starts ("kernel raised ValueError: ...").
KERNEL_RAISED = "kernel raised "


class KernelRaised(PropertyFailure):
    """The kernel raised on input the spec defines (it must return a result)."""


class KernelExited(BaseException):
    """The kernel tried to end the process: ``sys.exit`` (any status, 0 included), or
    ``KeyboardInterrupt`` raised by a kernel running in a worker process (CONF-5).

    Not an ``Exception``, so no property can take it for an answer (a property that
    accepts any exception as a rejection must not accept this); the runner turns it into
    a failed verdict on the inputs of the call.
    """

    def __init__(self, failure: PropertyFailure) -> None:
        super().__init__(failure.finding)
        self.failure = failure


class KernelHung(KernelExited):
    """The kernel did not return within the per-call timeout: the check ended the process
    running it (and everything the kernel started) and went on (CONF-5).  Counted against
    the run's stall budget."""


class KernelStalled(BaseException):
    """Raised by the judge's handle on the kernel's process when a call outlasts the
    timeout; the call guard turns it into :class:`KernelHung` with the call's inputs."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no answer within {seconds:g} s")
        self.seconds = seconds


class KernelProcessDied(BaseException):
    """The kernel's process ended (a crash, a signal, an exit) during a call; ``how`` says
    how.  The call guard turns it into :class:`KernelExited` with the call's inputs."""

    def __init__(self, how: str) -> None:
        super().__init__(how)
        self.how = how


class InputsChangedLater(PropertyFailure):
    """The kernel changed the inputs of an earlier call after that call had returned
    (SDPA-1.6), seen in the kernel's process at a later request."""
