"""One check, validated once, and the one way it runs: the CLI, the Python API and the
pytest plugin each turn their flags or arguments into a :class:`RunPlan` with
:func:`plan_run`, and the CLI and the API run it with :func:`execute`.

A :class:`RunPlan` holds the kernel's setup, the properties selected (``--only``/``--skip``,
unknown ids rejected), the profile and seed (an unknown profile rejected), the size caps,
the worker supervision, the number of workers (more than one only in worker processes) and
the report files (an unknown format, or a path that cannot be written, rejected).
:func:`plan_run` checks them all before anything is loaded, with one
:class:`~.kernel_setup.SetupError` (a ``ValueError``) naming what was wrong.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..backends import FLOAT_DTYPE_NAMES
from .call.side_effects import hypothesis_storage_elsewhere
from .draw.sizes import SizeLimits
from .judge.diagnosis import from_lines
from .judge.failures import KERNEL_RAISED
from .judge.kernel import KernelUnderTest
from .judge.registry import Property
from .judge.reproduce import rerun_command
from .judge.verdict import FAILED, NOT_APPLICABLE, NOT_RUN, WARNING, Report, Verdict
from .kernels.known import target_write_ups
from .report import render
from .report.files import BackgroundWrites, ReportFiles, Rerun, interruption, still_running
from .run.kernel_setup import KernelSetup, SetupError
from .run.property_runner import hypothesis_settings, new_report, select
from .run.supervisor import InProcessKernel, IsolatedKernel, IsolationOptions
from .run.worker_pool import (
    JOBS_VARIABLE,
    WorkerPool,
    default_jobs,
    jobs_from_environment,
    open_session,
    parse_jobs,
    run_properties,
)

Session = IsolatedKernel | InProcessKernel | WorkerPool
Progress = Callable[[Property, "Verdict | None"], None]
REPORT_FORMATS = ("json", "junit", "markdown")


@dataclass(frozen=True)
class RunPlan:
    """A validated check: ``properties`` in the order they run; ``partial`` when
    ``--only``/``--skip`` chose them (the report then makes no conformance claim, CONF-6);
    ``isolation`` None runs the kernel in this process, else in ``jobs`` workers
    (``sized_by_cpus``, the default number: only the first when the kernel turns out to
    run on an accelerator);
    ``reports``: (format, path) of each report file, every path checked writable."""

    setup: KernelSetup
    properties: tuple[Property, ...]
    profile: str = "quick"
    seed: int | None = None
    strict: bool = False
    limits: SizeLimits = field(default_factory=SizeLimits)
    isolation: IsolationOptions | None = None
    jobs: int = 1
    sized_by_cpus: bool = False
    partial: bool = False
    reports: tuple[tuple[str, Path], ...] = ()

    def session(self, kernel: KernelUnderTest | None = None) -> Session:
        """Where the kernel runs (see :func:`.jobs.open_session`); ``kernel``: one already
        loaded in this process, for an in-process run."""
        try:
            return open_session(
                self.setup, self.isolation, kernel, self.jobs, sized_by_cpus=self.sized_by_cpus
            )
        except ValueError as exc:
            raise SetupError(str(exc)) from None

    def report_files(self) -> ReportFiles:
        """The report files, each written by :func:`render_report` in its format."""
        return ReportFiles(
            [
                (f"--{fmt}", path, functools.partial(render_report, fmt))
                for fmt, path in self.reports
            ]
        )


def render_report(fmt: str, report: Report, rerun: Rerun | None = None) -> str:
    """``report`` in ``fmt`` (one of :data:`REPORT_FORMATS`); JSON and Markdown with the
    confirmed write-ups of the kernel's known divergences (``known_kernels``)."""
    if fmt == "junit":
        return render.to_junit(report, rerun=rerun)
    to_text = render.to_json if fmt == "json" else render.to_markdown
    return to_text(report, rerun=rerun, write_ups=target_write_ups(report.kernel))


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
    jobs: int | str | None = 1,
    reports: Mapping[str, str | os.PathLike[str] | None] | None = None,
) -> RunPlan:
    """The plan of a check, every choice validated here; :class:`SetupError` on the first
    bad one (an unknown property id or profile, a bad number of jobs, more than one job
    without worker processes, a report format not in :data:`REPORT_FORMATS` or a report
    path that cannot be written).  ``jobs`` None: the default, ATTNSPEC_JOBS where set,
    else one worker per CPU (:func:`.jobs.default_jobs`) when the kernel runs isolated and
    on a CPU; one in-process either way."""
    only, skip = (None if ids is None else tuple(ids) for ids in (only, skip))
    try:
        properties = tuple(select(only, skip))
        hypothesis_settings(profile, seed)  # an unknown profile, before any work
        from_environment = jobs_from_environment() if jobs is None else None
        sized_by_cpus = False
        if jobs is None and isolation is None:
            workers = 1  # a default: in-process runs one at a time
        elif from_environment is not None:
            workers = parse_jobs(from_environment, JOBS_VARIABLE)
        elif jobs is None:
            workers, sized_by_cpus = default_jobs(), True
        else:
            workers = parse_jobs(jobs)
    except ValueError as exc:
        raise SetupError(str(exc)) from None
    if workers > 1 and isolation is None:
        raise SetupError(
            f"jobs={workers} runs properties in worker processes, but --no-isolate "
            "(isolate=False) runs the kernel in this one, one property at a time: use jobs=1"
        )
    plan = RunPlan(
        setup,
        properties,
        profile,
        seed,
        strict,
        limits or SizeLimits(),
        isolation,
        workers,
        sized_by_cpus=sized_by_cpus,
        partial=bool(only or skip),
        reports=_report_paths(reports or {}),
    )
    plan.report_files().check_writable()
    return plan


def _report_paths(
    reports: Mapping[str, str | os.PathLike[str] | None],
) -> tuple[tuple[str, Path], ...]:
    unknown = sorted(set(reports) - set(REPORT_FORMATS))
    if unknown:
        raise SetupError(
            f"reports has the format(s) {unknown}, but should name only {list(REPORT_FORMATS)}"
        )
    given = {fmt: Path(path) for fmt, path in reports.items() if path is not None}
    return tuple((fmt, given[fmt]) for fmt in REPORT_FORMATS if fmt in given)


@dataclass
class Execution:
    """What running a plan left: the report, the command that reruns one of its
    verdicts (None without ``rerun_flags``) and why a report file could not be written
    (option -> reason; empty when every file was written)."""

    report: Report
    rerun: Rerun | None
    file_errors: dict[str, str]


def execute(
    plan: RunPlan,
    progress: Progress | None = None,
    kernel: KernelUnderTest | None = None,
    *,
    rerun_flags: Sequence[str] | None = None,
    interruptible: bool = False,
) -> Execution:
    """Run ``plan``: with ``plan.isolation``, the kernel is loaded and run in a supervised
    worker process (:mod:`.isolation`), in ``plan.jobs`` of them at once when more than one
    (:mod:`.jobs`: the same verdicts in the same order); otherwise in this one (``kernel``,
    if given, is used as is).  ``progress`` hears each property start and end; the report
    files are written at the start and after every verdict (marked incomplete until the
    end).  ``rerun_flags``: the ``attnspec check`` flags that rerun a verdict
    (:func:`.reproduce.rerun_command`).  An interrupt (Ctrl-C, SIGTERM) marks the report
    incomplete and, ``interruptible``, ends the run with the verdicts so far; otherwise it
    is raised after the files are written."""
    total = len(plan.properties)
    started = time.perf_counter()
    files = plan.report_files()
    session = plan.session(kernel)
    with hypothesis_storage_elsewhere(), session:
        report = start_report(session, plan)
        rerun = None
        if rerun_flags is not None:
            flags, target = tuple(rerun_flags), report.kernel

            def rerun(verdict: Verdict) -> str:
                return rerun_command(target, flags, verdict.property, plan.seed)

        files.write(report, rerun, incomplete=still_running(0, total))
        writes = BackgroundWrites(files)

        def heard(prop: Property, verdict: Verdict | None) -> None:
            if progress is not None:
                progress(prop, verdict)
            done = len(report.verdicts)
            if verdict is not None and done < total:
                writes.submit(report, rerun, still_running(done, total))

        try:
            run_properties(
                session,
                plan.properties,
                report,
                heard,
                profile=plan.profile,
                seed=plan.seed,
                limits=plan.limits,
            )
        except KeyboardInterrupt as exc:
            report.incomplete = interruption(exc, len(report.verdicts), total)
            if not interruptible:
                writes.close()
                files.write(report, rerun)
                raise
        finally:
            writes.close()
        finish_report(report, session, partial=plan.partial)
        report.wall_seconds = time.perf_counter() - started
    files.write(report, rerun)
    return Execution(report, rerun, files.errors)


def start_report(session: Session, plan: RunPlan) -> Report:
    """Load the session's kernel and give the empty report of ``plan``'s run, with the
    notes on the library's settings and the hints read off the kernel before anything
    ran."""
    kernel = session.start()
    report = new_report(
        kernel, profile=plan.profile, seed=plan.seed, strict=plan.strict, limits=plan.limits
    )
    report.notes = list(session.setup_notes())
    report.hints = list(kernel.setup_hints)
    return report


def finish_report(report: Report, session: Session, *, partial: bool) -> None:
    """Add the hints from probing a kernel that failed (in its worker when isolated) and
    the conformance claim, or why there is none (``partial``: --only/--skip)."""
    kernel = session.start()
    failed = [v for v in report.verdicts if v.status in (FAILED, WARNING)]
    not_run = [v for v in report.verdicts if v.status == NOT_RUN]
    if not_run and not report.incomplete and not any(v.status == FAILED for v in failed):
        # stopped by --deadline with nothing failed: no claim either way (CONF-6)
        report.incomplete = f"{len(not_run)} properties not run: {not_run[0].detail}"
    if any(v.stalled for v in report.verdicts):
        stalls = sum(v.stalled for v in report.verdicts)
        report.notes.append(
            f"the kernel hangs: {stalls} of its calls outlasted --timeout (each ended the "
            "kernel's process and whatever it had started) [CONF-5]"
        )
    if failed and not report.incomplete and not not_run:
        raised = any(v.detail.startswith(KERNEL_RAISED) for v in failed)
        hints, causes = from_lines(session.run_hints(len(failed), raised))
        report.hints.extend(hints)
        report.causes.extend(causes)
    report.claim = render.claim_line(report, kernel.declaration, kernel.dtypes, partial=partial)
    report.not_checked = not_checked(report, kernel.declaration.dtypes, kernel.dtypes, partial)
    # kernel calls an isolated session lost, or that outlasted --timeout in its worker
    lost: int = getattr(session, "lost", 0) + sum(v.stalled for v in report.verdicts)
    if failed and lost:
        report.not_checked.append(
            "the causes of the failures (no diagnosis probe ran: a kernel call crashed, "
            "exited or hung, and probing could cost another timeout)"
        )


def not_checked(
    report: Report,
    declared: Sequence[str] | None,
    checked: Sequence[str],
    partial: bool,
) -> list[str]:
    """What the run did not check, each with why: the dtypes not checked (not declared, or
    the backend cannot express them: NumPy has no bfloat16), the properties of features
    the kernel does not declare, the clauses it waives, the properties --only/--skip left
    out."""
    unchecked = []
    for dtype in FLOAT_DTYPE_NAMES:
        if dtype in checked:
            continue
        if declared is not None and dtype not in declared:
            unchecked.append(f"{dtype} (not declared)")
        else:
            unchecked.append(f"{dtype} ({report.backend} cannot express it)")
    undeclared = [v.property for v in report.verdicts if v.status == NOT_APPLICABLE]
    if undeclared:
        unchecked.append(
            f"{len(undeclared)} properties of features not declared or not applicable "
            f"({', '.join(undeclared)})"
        )
    if report.waived:
        unchecked.append(f"{', '.join(report.waived)} (waived by the declaration, CONF-7)")
    if partial:
        unchecked.append("the properties --only/--skip left out")
    return unchecked
