"""One check, validated once: what the CLI, the Python API and the pytest plugin run.

A :class:`RunPlan` holds the kernel's setup, the properties selected (``--only``/``--skip``,
unknown ids rejected), the profile and seed (an unknown profile rejected), the size caps,
the worker supervision and the number of workers.  :func:`plan_run` checks them all before
anything is loaded, with one :class:`~.kernel_setup.SetupError` (a ``ValueError``) naming
what was wrong; each front end only turns its own flags or arguments into a plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .isolation import InProcessKernel, IsolatedKernel, IsolationOptions
from .jobs import WorkerPool, open_session, parse_jobs
from .kernel import KernelUnderTest
from .kernel_setup import KernelSetup, SetupError
from .registry import Property
from .runner import hypothesis_settings, select
from .sizes import SizeLimits

Session = IsolatedKernel | InProcessKernel | WorkerPool


@dataclass(frozen=True)
class RunPlan:
    """A validated check: ``properties`` in the order they run; ``partial`` when
    ``--only``/``--skip`` chose them (the report then makes no conformance claim, CONF-6);
    ``isolation`` None runs the kernel in this process, else in ``jobs`` workers."""

    setup: KernelSetup
    properties: tuple[Property, ...]
    profile: str = "quick"
    seed: int | None = None
    strict: bool = False
    limits: SizeLimits = field(default_factory=SizeLimits)
    isolation: IsolationOptions | None = None
    jobs: int = 1
    partial: bool = False

    def session(self, kernel: KernelUnderTest | None = None) -> Session:
        """Where the kernel runs (see :func:`.jobs.open_session`); ``kernel``: one already
        loaded in this process, for an in-process run."""
        try:
            return open_session(self.setup, self.isolation, kernel, self.jobs)
        except ValueError as exc:
            raise SetupError(str(exc)) from None


def plan_run(
    setup: KernelSetup,
    *,
    profile: str = "quick",
    seed: int | None = None,
    only: Iterable[str] | None = None,
    skip: Iterable[str] | None = None,
    strict: bool = False,
    limits: SizeLimits | None = None,
    isolation: IsolationOptions | None = None,
    jobs: int | str = 1,
) -> RunPlan:
    """The plan of a check, every choice validated here; :class:`SetupError` on the first
    bad one (an unknown property id or profile, a bad number of jobs)."""
    only, skip = (None if ids is None else tuple(ids) for ids in (only, skip))
    try:
        properties = tuple(select(only, skip))
        hypothesis_settings(profile, seed)  # an unknown profile, before any work
        workers = parse_jobs(jobs)
    except ValueError as exc:
        raise SetupError(str(exc)) from None
    return RunPlan(
        setup,
        properties,
        profile,
        seed,
        strict,
        limits or SizeLimits(),
        isolation,
        workers,
        partial=bool(only or skip),
    )
