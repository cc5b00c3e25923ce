"""Running properties in several supervised worker processes at once (``--jobs N``).

A :class:`WorkerPool` is ``N`` :class:`~.isolation.IsolatedKernel` sessions over one
:class:`~.kernel_setup.KernelSetup`: each keeps its own worker process, restarts it after a crash,
exit or hang and attributes that to the property it was running, exactly as a single
isolated run does.  :func:`run_in_parallel` hands the properties out one at a time, in
their order, to whichever worker is free, from one supervisor thread per worker (the
threads only wait on their worker's pipe: the kernel and the properties run in the worker
processes).  Everything else happens on the calling thread, so the report, the progress
display and the report files see one event at a time:

* ``report.verdicts`` always holds the finished verdicts in the order of the properties
  (clause order), whatever order they finished in, so output and reports are the same
  for every ``N``, and the verdicts themselves too (each property draws from seeds of its
  own, :func:`.runner._stratum_seed`);
* an interrupt (Ctrl-C, SIGTERM) on the calling thread kills every worker, drops the
  verdicts of properties that were still running, and re-raises: the caller keeps every
  finished verdict and marks the report incomplete, as with one worker.

The failures then re-run around the other clauses the kernel failed
(:func:`.root_causes.draw_around`) over the same workers, in the same way
(:func:`each_in_parallel`): draw_around hands over the verdicts it can settle at once
(those of the clauses that govern no input feature, after those that do, settled clause
by clause; the module doc of :mod:`.root_causes` says why the outcome is that of settling
them one by one); each verdict's re-runs run one after the other in one worker, and the
settled verdict replaces the found one in the report on the calling thread.  A crash or
hang in a re-run is attributed by the worker's session as in any run; an interrupt leaves
the verdicts not yet settled as they were found, and an aborted session refuses the next
re-run (:class:`.isolation.Aborted`) rather than start a worker again.

Each worker's thread pools (BLAS, OpenMP, PyTorch's intra-op pool) get the available
CPUs divided by ``N`` (:func:`.isolation.worker_threads`, unless the user set
OMP_NUM_THREADS or another of its variables): N workers do not start a thread per core
each.  Parallel runs need worker processes: ``--no-isolate`` runs one property at a time.
"""

from __future__ import annotations

import os
import queue
import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..judge.kernel import KernelUnderTest
from ..judge.verdict import Report, Verdict
from .budget import RunBudget
from .property_runner import run_each
from .supervisor import InProcessKernel, IsolatedKernel, available_cpus

if TYPE_CHECKING:
    from ..draw.sizes import SizeLimits
    from ..judge.kernel_info import KernelInfo
    from ..judge.registry import Property
    from .kernel_setup import KernelSetup
    from .supervisor import IsolationOptions

Progress = Callable[["Property", "Verdict | None"], None]
T = TypeVar("T")
R = TypeVar("R")
AUTO = "auto"
# The environment variable that sets the number of workers of a run that does not say
# (--jobs not given), as --jobs does: a shared CI machine sets ATTNSPEC_JOBS=1.
JOBS_VARIABLE = "ATTNSPEC_JOBS"
# Workers of a run that says nothing (no --jobs, no ATTNSPEC_JOBS): one per CPU, at most this many.
# A quick profile is ~60 properties, the longest a few percent of the whole, so more
# workers gain little and each holds its own copy of the kernel's library in memory.
MOST_DEFAULT_JOBS = 4
_JOIN_GRACE = 5.0  # s an aborted worker's thread gets to notice that its worker is gone


def default_jobs() -> int:
    """Workers when neither the run nor ATTNSPEC_JOBS says: one per available CPU, at most
    MOST_DEFAULT_JOBS (one, the first, when the kernel turns out to run on an accelerator:
    :meth:`WorkerPool.running`)."""
    return min(available_cpus(), MOST_DEFAULT_JOBS)


def jobs_from_environment(environ: Mapping[str, str] | None = None) -> str | None:
    """ATTNSPEC_JOBS as --jobs takes it (checked by :func:`parse_jobs`), None when unset
    or empty."""
    value = (os.environ if environ is None else environ).get(JOBS_VARIABLE, "").strip()
    return value or None


def parse_jobs(value: int | str | None, name: str = "jobs") -> int:
    """Worker processes for ``value``: a positive integer, ``"auto"`` (one per available
    CPU) or None (1); ValueError naming ``name`` otherwise."""
    if value is None:
        return 1
    if isinstance(value, str):
        text = value.strip().lower()
        if text == AUTO:
            return available_cpus()
        # ASCII digits only: str.isdigit() also takes '²', which int() then rejects unnamed
        value = int(text) if text.isascii() and text.isdigit() else text
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{name}={value!r}, but should be a positive integer or "
            f"{AUTO!r} (one worker per available CPU)"
        )
    return value


class WorkerPool:
    """``jobs`` isolated sessions of one kernel; the same interface as one
    :class:`~.isolation.IsolatedKernel` (``start``, ``close``, ``setup_notes``,
    ``run_property``, ``run_hints``), with :func:`run_in_parallel` over all of them.
    ``sized_by_cpus``: the pool was sized by the CPUs (the default number of jobs), so a kernel
    on an accelerator runs in its first worker only (:meth:`running`)."""

    def __init__(
        self,
        setup: KernelSetup,
        options: IsolationOptions,
        jobs: int,
        *,
        sized_by_cpus: bool = False,
    ) -> None:
        if jobs < 1:
            raise ValueError(f"jobs={jobs!r}, but should be at least 1")
        self.sessions = [IsolatedKernel(setup, options, jobs) for _ in range(jobs)]
        self.sized_by_cpus = sized_by_cpus

    def running(self) -> list[IsolatedKernel]:
        """The sessions the run uses: all of them, or only the first when the pool is
        ``sized_by_cpus`` and the kernel's device is an accelerator, which workers would share
        (and where each JAX process reserves most of its memory).  Loads the kernel in the
        first worker to learn its device."""
        if self.sized_by_cpus and not self.start().backend.on_cpu:
            return self.sessions[:1]
        return self.sessions

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def lost(self) -> int:
        """Verdicts lost with their worker, in all sessions."""
        return sum(session.lost for session in self.sessions)

    def start(self) -> KernelInfo:
        """Load the kernel in the first worker (a setup error shows before anything runs);
        the others start in their own threads when the run begins."""
        return self.sessions[0].start()

    def close(self) -> None:
        for session in self.sessions:
            session.close()

    def abort(self) -> None:
        for session in self.sessions:
            session.abort()

    def setup_notes(self) -> tuple[str, ...]:
        return self.sessions[0].setup_notes()

    def run_property(
        self, prop: Property, *, profile: str, seed: int | None, limits: SizeLimits | None = None
    ) -> Verdict:
        return self.sessions[0].run_property(prop, profile=profile, seed=seed, limits=limits)

    def run_hints(self, failures: int, raised: bool = False) -> list[str]:
        """The first worker's hints; none once any worker lost a verdict (as for one)."""
        return [] if self.lost else self.sessions[0].run_hints(failures, raised)


def run_in_parallel(
    properties: Iterable[Property],
    sessions: list[Any],
    run_one: Callable[[Any, Property], Verdict],
    report: Report,
    progress: Progress | None = None,
) -> Report:
    """``run_one(session, prop)`` for every property, one thread per session, into
    ``report``; see the module doc for the order of ``report.verdicts`` and for
    interrupts, and :func:`each_in_parallel` for errors."""
    chosen = list(properties)
    finished: dict[int, Verdict] = {}

    def started(index: int) -> None:
        if progress:
            progress(chosen[index], None)

    def done(index: int, verdict: Verdict) -> None:
        finished[index] = verdict
        report.verdicts[:] = [finished[i] for i in sorted(finished)]
        if progress:
            progress(chosen[index], verdict)

    each_in_parallel(chosen, sessions, run_one, done, started)
    return report


def each_in_parallel(
    items: Sequence[T],
    sessions: list[Any],
    run_one: Callable[[Any, T], R],
    done: Callable[[int, R], None],
    started: Callable[[int], None] | None = None,
) -> None:
    """``run_one(session, item)`` for every item, one thread per session (no more threads
    than items), each taking the next item in order when free; ``started(index)`` and
    ``done(index, result)`` are called on the calling thread, one at a time.  An exception
    from ``run_one`` (a worker that cannot be restarted: SetupError) stops the run and is
    raised here; so is an interrupt, after every session is aborted (see the module doc).
    ValueError for no sessions (nothing would run the items, and this would wait forever)."""
    if not sessions:
        raise ValueError("sessions=[], but should hold at least one session to run the items")
    sessions = sessions[: max(1, len(items))]  # a worker starts only to run something
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(len(items)):
        todo.put(index)
    events: queue.SimpleQueue[tuple[str, int, Any]] = queue.SimpleQueue()
    stop = threading.Event()

    def work(session: Any) -> None:
        while not stop.is_set():
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            events.put(("start", index, None))
            try:
                result = run_one(session, items[index])
            except BaseException as exc:  # handed to the calling thread, which raises it
                events.put(("error", index, exc))
                return
            events.put(("done", index, result))

    threads = [
        threading.Thread(target=work, args=(session,), name=f"attnspec-job-{i}", daemon=True)
        for i, session in enumerate(sessions)
    ]
    finished = 0
    try:
        for thread in threads:
            thread.start()
        while finished < len(items):
            kind, index, payload = events.get()
            if kind == "error":
                raise payload
            if kind == "start":
                if started:
                    started(index)
                continue
            finished += 1
            done(index, payload)
    except BaseException:
        stop.set()
        for session in sessions:
            session.abort()
        for thread in threads:
            thread.join(_JOIN_GRACE)
        raise
    for thread in threads:
        thread.join()


def run_properties(
    session: IsolatedKernel | InProcessKernel | WorkerPool,
    properties: Iterable[Property],
    report: Report,
    progress: Progress | None = None,
    *,
    profile: str,
    seed: int | None,
    limits: SizeLimits | None,
) -> Report:
    """Every property on ``session`` into ``report``: in parallel on a :class:`WorkerPool`,
    else one after the other (:func:`.runner.run_each`); then the failures re-run around
    the other clauses the kernel failed (:func:`.root_causes.draw_around`), those it can
    settle at once over the pool's workers, else one after the other."""
    from ..draw.sizes import SizeLimits
    from .root_causes import Keep, Rerun, Settle, SettleAll, draw_around, one_at_a_time

    chosen = list(properties)
    budget = budget_of(session)
    in_clause_order = {prop.id: i for i, prop in enumerate(chosen)}
    if judging_strictly(session):  # --judge: a seeded random order, reported in clause order
        random.Random(seed).shuffle(chosen)

    def run_on(on: Any, prop: Property, within: SizeLimits | None = limits) -> Verdict:
        reason = budget.reason_to_stop()
        if reason:
            return budget.not_run(prop, reason)
        verdict: Verdict = on.run_property(prop, profile=profile, seed=seed, limits=within)
        budget.heard(verdict)
        return verdict

    def rerun_on(on: Any) -> Rerun:
        return lambda prop, around: run_on(on, prop, around)

    settle_all: SettleAll
    if isinstance(session, WorkerPool):
        running = session.running()
        run_in_parallel(chosen, running, run_on, report, progress)

        def settle_all(settles: Sequence[Settle], keep: Keep) -> None:
            each_in_parallel(settles, running, lambda on, settle: settle(rerun_on(on)), keep)

    else:
        run_each(chosen, lambda prop: run_on(session, prop), report, progress)
        settle_all = one_at_a_time(rerun_on(session))
    report.verdicts.sort(key=lambda verdict: in_clause_order.get(verdict.property, 0))
    chosen.sort(key=lambda prop: in_clause_order[prop.id])
    return draw_around(report, chosen, settle_all, limits or SizeLimits())


def judging_strictly(session: IsolatedKernel | InProcessKernel | WorkerPool) -> bool:
    """Whether the run is a --judge run (isolated, with IsolationOptions.judge)."""
    first = session.sessions[0] if isinstance(session, WorkerPool) else session
    options = getattr(first, "options", None)
    return bool(getattr(options, "judge", False))


def budget_of(session: IsolatedKernel | InProcessKernel | WorkerPool) -> RunBudget:
    """The run's :class:`RunBudget` from its supervision options (an in-process run has no
    timeout, so no stall budget and no deadline)."""
    first = session.sessions[0] if isinstance(session, WorkerPool) else session
    options = getattr(first, "options", None)
    if options is None:
        return RunBudget()
    started = getattr(first, "created_at", None)
    if started is None:
        return RunBudget(options.stall_budget, options.deadline)
    return RunBudget(options.stall_budget, options.deadline, started=started)


def open_session(
    setup: KernelSetup,
    isolation: IsolationOptions | None,
    kernel: KernelUnderTest | None = None,
    jobs: int = 1,
    *,
    sized_by_cpus: bool = False,
) -> IsolatedKernel | InProcessKernel | WorkerPool:
    """Isolated when ``isolation`` is given (then ``kernel`` must be None), in ``jobs``
    worker processes when more than one (:mod:`.jobs`; ``sized_by_cpus``: only when the kernel
    runs on a CPU, :meth:`WorkerPool.running`); else in-process."""
    if isolation is None:  # jobs is 1 here: run_plan.plan_run checked it
        return InProcessKernel(setup, kernel)
    if kernel is not None:
        raise ValueError(
            "kernel=, a kernel loaded in this process, cannot run isolated; pass isolation=None"
        )
    if jobs == 1:
        return IsolatedKernel(setup, isolation)
    return WorkerPool(setup, isolation, jobs, sized_by_cpus=sized_by_cpus)
