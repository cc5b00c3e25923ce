"""The Python API a kernel project calls from its tests, and the one way a check runs.

The CLI, the pytest plugin and :func:`assert_conforms` all set the kernel up with
:class:`~.kernel_setup.KernelSetup` (load, adapt, claims, signature checked before anything
runs) and validate the run once (:func:`.plan.plan_run`, report files included); the
CLI and :func:`run` run it with :func:`.plan.execute`.

    >>> from attnspec.conformance import assert_conforms
    >>> assert_conforms(my_attention, backend="torch", bias=True)  # in a test
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..backends import Backend
from .claims.flags import comma_list
from .judge.kernel import KernelUnderTest
from .judge.kernel_info import setup_notes as setup_notes
from .judge.reproduce import reproduction_file
from .judge.verdict import Report
from .plan import Progress, RunPlan, execute, plan_run
from .report.render import format_table

# the API's names, documented as api.* (`X as X`: an explicit re-export)
from .run.kernel_setup import KernelSetup as KernelSetup
from .run.kernel_setup import SetupError as SetupError
from .run.kernel_setup import size_limits as size_limits
from .run.kernel_setup import size_limits_from as size_limits_from
from .run.shared_flags import SIZE_FLAGS as SIZE_FLAGS
from .run.supervisor import IsolationOptions


def run(
    plan: RunPlan, progress: Progress | None = None, kernel: KernelUnderTest | None = None
) -> Report:
    """Run ``plan`` (see :func:`.plan.plan_run` and :func:`.plan.execute`; the
    kernel is in ``kernel``, if given, in this process) and write its report files;
    ``progress`` hears each property start and end.  ``OSError`` names the report files
    that could not be written."""
    done = execute(plan, progress, kernel)
    if done.file_errors:
        raise OSError("; ".join(done.file_errors.values()))
    return done.report


def check(
    kernel: str | Callable[..., Any],
    *,
    backend: str | Backend | None = None,
    device: str | None = None,
    profile: str = "quick",
    seed: int | None = None,
    only: str | Iterable[str] | None = None,
    skip: str | Iterable[str] | None = None,
    strict: bool = False,
    layout: str = "bhld",
    rename: Mapping[str, str] | None = None,
    dtypes: str | Iterable[str] | None = None,
    max_len: int | None = None,
    max_head_dim: int | None = None,
    max_batch_heads: int | None = None,
    jax_x64: bool | None = None,
    isolate: bool | IsolationOptions = False,
    jobs: int | str | None = None,
    reports: Mapping[str, str | os.PathLike[str]] | None = None,
    **claims: Any,
) -> Report:
    """Check ``kernel`` (a callable or ``"MODULE:FUNC"``) clause by clause.

    ``only``, ``skip`` and ``dtypes`` take lists, or one string of comma-separated names
    (as the CLI's flags: ``only="default-scale,causal-zeros"``).  ``claims`` override
    fields of the kernel's :class:`KernelDeclaration`; ``layout``,
    ``rename``, ``dtypes`` and ``jax_x64`` are as for :class:`KernelSetup`.  ``max_len``,
    ``max_head_dim`` and ``max_batch_heads`` cap (or raise) the largest Lq/Lk, E/Ev and
    batch x query heads drawn (defaults 4096, 256, 512).  ``isolate=True`` (or an
    :class:`~.isolation.IsolationOptions`) runs the kernel in a supervised worker process,
    as ``attnspec check`` does: a crash, exit or hang is then a failed verdict; a callable
    kernel must be importable by its module and name.  ``jobs`` (with ``isolate``) runs
    that many worker processes at once (``"auto"``: one per available CPU; None, the
    default: ATTNSPEC_JOBS where set, else one per CPU, at most 4, when the kernel runs on
    a CPU, and one on an accelerator), with the same verdicts in the same order.
    ``reports`` maps a format ("json", "junit", "markdown") to the file the report is
    written to (rewritten after every property, as ``attnspec check --json PATH`` does).
    Bad setup (target, signature, backend, option) raises :class:`SetupError`, a
    ``ValueError``.
    """
    limits = size_limits(max_len, max_head_dim, max_batch_heads)
    setup = KernelSetup(
        kernel,
        backend,
        device,
        layout,
        dict(rename or {}),
        None if dtypes is None else tuple(comma_list(dtypes) or ()),
        claims,
        jax_x64,
    )
    isolation = IsolationOptions() if isolate is True else (isolate or None)
    return run(
        plan_run(
            setup,
            profile=profile,
            seed=seed,
            only=comma_list(only),
            skip=comma_list(skip),
            strict=strict,
            limits=limits,
            isolation=isolation,
            jobs=jobs,
            reports=reports,
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
