"""The Python API a kernel project calls from its tests, and the one way a check runs.

The CLI, the pytest plugin and :func:`assert_conforms` all set the kernel up with
:class:`~.kernel_setup.KernelSetup` (load, adapt, claims, signature checked before anything
runs) and validate the run once (:func:`.run_plan.plan_run`); :func:`run` runs it.

    >>> from attnspec.conformance import assert_conforms
    >>> assert_conforms(my_attention, backend="torch", bias=True)  # in a test
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..backends import Backend
from .isolation import IsolationOptions
from .jobs import run_properties
from .kernel import KernelUnderTest

# the API's names, documented as api.* (`X as X`: an explicit re-export)
from .kernel_setup import SIZE_FLAGS as SIZE_FLAGS
from .kernel_setup import KernelSetup as KernelSetup
from .kernel_setup import SetupError as SetupError
from .kernel_setup import setup_notes as setup_notes
from .kernel_setup import size_limits as size_limits
from .kernel_setup import size_limits_from as size_limits_from
from .registry import Property
from .report import claim_line, format_table
from .reproduce import reproduction_file
from .run_plan import RunPlan, Session, plan_run
from .runner import (
    FAILED,
    WARNING,
    Report,
    Verdict,
    new_report,
)
from .side_effects import hypothesis_storage_elsewhere
from .sizes import SizeLimits

Progress = Callable[[Property, "Verdict | None"], None]


def run(
    plan: RunPlan, progress: Progress | None = None, kernel: KernelUnderTest | None = None
) -> Report:
    """Run ``plan`` (see :func:`.run_plan.plan_run`): with ``plan.isolation``, the kernel
    is loaded and run in a supervised worker process (:mod:`.isolation`), in
    ``plan.jobs`` of them at once when more than one (:mod:`.jobs`: the same verdicts in
    the same order); otherwise in this one (``kernel``, if given, is used as is).
    ``progress`` hears each property start and end."""
    session = plan.session(kernel)
    with hypothesis_storage_elsewhere(), session:
        report = start_report(
            session, profile=plan.profile, seed=plan.seed, strict=plan.strict, limits=plan.limits
        )
        run_properties(
            session,
            list(plan.properties),
            report,
            progress,
            profile=plan.profile,
            seed=plan.seed,
            limits=plan.limits,
        )
        finish_report(report, session, partial=plan.partial)
    return report


def start_report(
    session: Session,
    *,
    profile: str,
    seed: int | None,
    strict: bool,
    limits: SizeLimits | None = None,
) -> Report:
    """Load the session's kernel and give the empty report of its run (within ``limits``),
    with the notes on the library's settings and the hints read off the kernel before
    anything ran."""
    kernel = session.start()
    report = new_report(kernel, profile=profile, seed=seed, strict=strict, limits=limits)
    report.notes = list(session.setup_notes())
    report.hints = list(kernel.setup_hints)
    return report


def finish_report(report: Report, session: Session, *, partial: bool) -> None:
    """Add the hints from probing a kernel that failed (in its worker when isolated) and
    the conformance claim, or why there is none (``partial``: --only/--skip)."""
    kernel = session.start()
    failures = sum(v.status in (FAILED, WARNING) for v in report.verdicts)
    if failures and not report.incomplete:
        report.hints.extend(session.run_hints(failures))
    report.claim = claim_line(report, kernel.declaration, kernel.dtypes, partial=partial)


def check(
    kernel: str | Callable[..., Any],
    *,
    backend: str | Backend | None = None,
    device: str | None = None,
    profile: str = "quick",
    seed: int | None = None,
    only: Iterable[str] | None = None,
    skip: Iterable[str] | None = None,
    strict: bool = False,
    layout: str = "bhld",
    rename: Mapping[str, str] | None = None,
    dtypes: Iterable[str] | None = None,
    max_len: int | None = None,
    max_head_dim: int | None = None,
    max_batch_heads: int | None = None,
    jax_x64: bool | None = None,
    isolate: bool | IsolationOptions = False,
    jobs: int | str = 1,
    **claims: Any,
) -> Report:
    """Check ``kernel`` (a callable or ``"MODULE:FUNC"``) clause by clause.

    ``claims`` override fields of the kernel's :class:`KernelDeclaration`; ``layout``,
    ``rename``, ``dtypes`` and ``jax_x64`` are as for :class:`KernelSetup`.  ``max_len``,
    ``max_head_dim`` and ``max_batch_heads`` cap (or raise) the largest Lq/Lk, E/Ev and
    batch x query heads drawn (defaults 4096, 256, 512).  ``isolate=True`` (or an
    :class:`~.isolation.IsolationOptions`) runs the kernel in a supervised worker process,
    as ``attnspec check`` does: a crash, exit or hang is then a failed verdict; a callable
    kernel must be importable by its module and name.  ``jobs`` (with ``isolate``) runs
    that many worker processes at once (``"auto"``: one per available CPU), with the same
    verdicts in the same order.  Bad setup (target, signature, backend, option) raises
    :class:`SetupError`, a ``ValueError``.
    """
    limits = size_limits(max_len, max_head_dim, max_batch_heads)
    setup = KernelSetup(
        kernel,
        backend,
        device,
        layout,
        dict(rename or {}),
        None if dtypes is None else tuple(dtypes),
        claims,
        jax_x64,
    )
    isolation = IsolationOptions() if isolate is True else (isolate or None)
    return run(
        plan_run(
            setup,
            profile=profile,
            seed=seed,
            only=only,
            skip=skip,
            strict=strict,
            limits=limits,
            isolation=isolation,
            jobs=jobs,
        )
    )


def assert_conforms(kernel: str | Callable[..., Any], **options: Any) -> Report:
    """:func:`check` ``kernel`` and raise ``AssertionError`` with the verdict table unless
    it conforms.

    Conforms means every applicable MUST property passed (CONF-1); SHOULD failures are
    warnings and fail only with ``strict=True``.  Returns the :class:`Report` so a test
    can also look at warnings.
    """
    report = check(kernel, **options)
    if not report.conforms:
        raise AssertionError(format_table(report, full_reproduction_in=reproduction_file))
    return report
