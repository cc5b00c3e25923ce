"""Running a kernel in a supervised worker process, so no kernel can take the check down.

The check's own process (the supervisor) never imports the kernel.  It starts a worker
(:mod:`.worker`, a fresh interpreter with the same ``sys.path``), sends it the
:class:`~.kernel_setup.KernelSetup`, and asks it for one whole property at a time; the worker
answers with the :class:`~.runner.Verdict`.  While a property runs, the worker reports
the start and return of every kernel call with the inputs of that call, so that:

* a crash, a signal (segfault, the out-of-memory killer) or any exit of the worker, exit
  status 0 included, becomes a FAILED verdict for the property that was running, naming
  what happened and the inputs of the call under way;
* a kernel call that does not return within ``timeout`` seconds is ended by the worker
  itself (the kernel runs in a process of its own, :mod:`.remote_kernel`), which reports
  it as a FAILED verdict naming those inputs; a worker that stops answering for longer
  (``timeout`` + ``load_timeout`` + 30 s: the judge's own drawing, reference or
  comparison did not finish) becomes a FAILED verdict that says the judging worker, not
  the kernel, stalled;

and in either case the worker is replaced and the check goes on with the next property.
The worker also caps its address space (``memory_limit_gib``), so a kernel that asks for
50 GB gets a ``MemoryError`` (a FAILED verdict) instead of exhausting the machine.  The
hints that probe a failing kernel (:func:`.hints.run_hints`) run in the worker too, under
the same watch; the supervisor never calls the kernel.  The worker is built from the same
:class:`~.kernel_setup.KernelSetup` (declaration, layout, renames, dtypes, JAX's
``jax_x64``), and its printing goes where the supervisor routes the kernel's output
(:func:`.side_effects.kernel_output_to`: stderr, ``--kernel-output PATH`` or nowhere).

:class:`InProcessKernel` gives the same interface for an in-process run (``--no-isolate``),
where a debugger can step into the kernel and nothing is protected.  The unit of work is
a whole property, so several workers can later share a list of properties.
"""

from __future__ import annotations

import contextlib
import io
import math
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ...backends import Backend
from ...backends._registry import compilation_cache_variables
from ..call.problem import Problem
from ..call.side_effects import hypothesis_storage_variables, kernel_output_fd
from ..claims.loading import load_kernel
from ..claims.table import Getter, UsageError
from ..draw.sizes import SizeLimits
from ..judge.convention_hints import run_hints
from ..judge.failures import PropertyFailure
from ..judge.kernel import KernelUnderTest
from ..judge.kernel_info import KernelInfo, setup_notes
from ..judge.registry import Property
from ..judge.verdict import Verdict
from .kernel_setup import KernelSetup, SetupError, WorkerStart, loader_source
from .property_runner import PROFILES, _failed_verdict, run_property
from .shared_flags import (
    DEFAULT_LOAD_TIMEOUT,
    DEFAULT_MEMORY_LIMIT_GIB,
    DEFAULT_STALL_BUDGET,
    DEFAULT_TIMEOUT,
)
from .thread_variables import THREAD_VARIABLES, WORKER_THREADS

FILE_MODULE_PREFIX = "attnspec_kernel_"  # how load_kernel names a file.py:FUNC module
_STOP_GRACE = 2.0  # s a stopped or dying worker gets to exit before it is killed
_LIVENESS_CHECK = 1.0  # s between checks that a silent worker is still alive


@dataclass(frozen=True)
class IsolationOptions:
    """How a worker is supervised: ``timeout`` seconds per kernel call (and per stretch of
    the suite's work between calls); ``memory_limit_gib`` GiB of address space the worker
    may add after loading its backend (0: no limit; applied on CPU devices only);
    ``load_timeout`` seconds to start a worker and load the backend and the kernel (at
    least ``timeout``)."""

    timeout: float = DEFAULT_TIMEOUT
    memory_limit_gib: float = DEFAULT_MEMORY_LIMIT_GIB
    load_timeout: float = DEFAULT_LOAD_TIMEOUT
    # properties whose kernel call outlasted ``timeout`` before the run stops (the rest
    # "not run"); ``deadline``: seconds of wall time after which no property starts
    stall_budget: int = DEFAULT_STALL_BUDGET
    deadline: float | None = None
    # the strictest judging, for generated or third-party kernels: every call made twice on
    # fresh copies and compared bit for bit, the inputs re-read after every call, the
    # properties run in a seeded random order (docs/checking-your-kernel.md, threat model)
    judge: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.stall_budget, int) and self.stall_budget >= 1):
            raise ValueError(
                f"stall_budget={self.stall_budget!r}, but should be a whole number >= 1"
            )
        if self.deadline is not None and not (
            isinstance(self.deadline, (int, float))
            and math.isfinite(self.deadline)
            and self.deadline > 0
        ):
            raise ValueError(
                f"deadline={self.deadline!r}, but should be a positive number of seconds"
            )
        for name in ("timeout", "load_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value!r}, but should be a positive number of seconds")
        if not (
            isinstance(self.memory_limit_gib, (int, float))
            and math.isfinite(self.memory_limit_gib)
            and self.memory_limit_gib >= 0
        ):
            raise ValueError(
                f"memory_limit_gib={self.memory_limit_gib!r}, but should be a "
                "number of GiB >= 0 (0: no limit)"
            )


def isolation_options(
    isolate: bool, get: Getter, *, prefix: str | None = None, without: str = "--no-isolate has none"
) -> IsolationOptions | None:
    """The worker's supervision from the :data:`SUPERVISION_FLAGS` (``get(dest)``, flags
    named ``--PREFIX-x`` when ``prefix``); None when not ``isolate`` (then those flags are
    a :class:`UsageError` that ends with ``without``).  :class:`UsageError` naming the
    flag for a bad value."""

    def name(option: str) -> str:
        return option if prefix is None else f"--{prefix}-{option[2:]}"

    timeout, memory = get("timeout"), get("memory_limit")
    stalls, deadline, judge = get("stall_budget"), get("deadline"), bool(get("judge"))
    if not isolate:
        given = [
            name(flag)
            for flag, value in (
                ("--timeout", timeout),
                ("--memory-limit", memory),
                ("--stall-budget", stalls),
                ("--deadline", deadline),
                ("--judge", judge or None),
            )
            if value is not None
        ]
        if given:
            raise UsageError(
                f"{' and '.join(given)} apply to the worker processes that run the "
                f"kernel; {without}"
            )
        return None
    try:
        return IsolationOptions(
            DEFAULT_TIMEOUT if timeout is None else timeout,
            DEFAULT_MEMORY_LIMIT_GIB if memory is None else memory,
            stall_budget=DEFAULT_STALL_BUDGET if stalls is None else stalls,
            deadline=deadline,
            judge=judge,
        )
    except ValueError as exc:
        raise UsageError(
            str(exc)
            .replace("timeout=", f"{name('--timeout')} ")
            .replace("memory_limit_gib=", f"{name('--memory-limit')} ")
            .replace("stall_budget=", f"{name('--stall-budget')} ")
            .replace("deadline=", f"{name('--deadline')} ")
        ) from None


class _SetupPickler(pickle.Pickler):
    """Pickles functions from ``file.py:FUNC`` modules as ``load_kernel("file.py:FUNC")``:
    their module's name is private to the process that loaded them."""

    def reducer_override(self, obj: Any) -> Any:
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        if (
            isinstance(obj, types.FunctionType)
            and module is not None
            and module.__name__.startswith(FILE_MODULE_PREFIX)
            and module.__file__
        ):
            return load_kernel, (f"{module.__file__}:{obj.__qualname__}",)
        return NotImplemented


def _dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _SetupPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


class WorkerDied(Exception):
    """The worker process ended; the message says how ("was killed by signal SIGSEGV ...")."""


def exit_description(returncode: int) -> str:
    """How a process ended, for a verdict: its exit status or the signal that killed it."""
    if returncode < 0:
        try:
            number = signal.Signals(-returncode)
        except ValueError:
            return f"was killed by signal {-returncode}"
        text = f"was killed by signal {number.name} ({signal.strsignal(number)})"
        if number == signal.SIGKILL:
            text += "; the out-of-memory killer sends SIGKILL"
        return text
    text = f"ended with exit status {returncode}"
    if returncode == 0:
        text += " (os._exit(0) or an exit from C code: no result, and not a success)"
    return text


def worker_threads(jobs: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a worker of a run with ``jobs`` workers gets on top of ``environ``
    (default this process's): every THREAD_VARIABLES set to max(1, CPUs // jobs), and
    WORKER_THREADS to the same count; nothing when ``environ`` sets any of them (the
    user's choice stands)."""
    environ = os.environ if environ is None else environ
    if any(name in environ for name in THREAD_VARIABLES):
        return {}
    count = str(max(1, available_cpus() // max(1, jobs)))
    return {**dict.fromkeys(THREAD_VARIABLES, count), WORKER_THREADS: count}


class _Worker:
    """One worker process and the connection to it."""

    def __init__(self, stdout: int, jobs: int = 1) -> None:
        self.connection, child = multiprocessing.Pipe()
        lifeline_read, self._lifeline = os.pipe()
        code = (
            f"import sys; sys.path[:] = {sys.path!r}; "
            "from attnspec.conformance.run.worker import main; main()"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, str(child.fileno()), str(lifeline_read)],
            pass_fds=(child.fileno(), lifeline_read),
            stdin=subprocess.DEVNULL,
            stdout=stdout,  # the kernel's own printing never lands in the table on stdout
            start_new_session=True,  # Ctrl-C is the supervisor's to handle, not the kernel's
            # set before the kernel's imports
            env={
                **os.environ,
                **worker_threads(jobs),
                **compilation_cache_variables(),
                **hypothesis_storage_variables(),
            },
        )
        child.close()
        os.close(lifeline_read)

    def send(self, message: Any) -> None:
        try:
            self.connection.send(message)
        except (BrokenPipeError, ConnectionResetError):
            raise WorkerDied(self._ended()) from None

    def receive(self, timeout: float) -> Any:
        """The next message, or None when none came within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if self.connection.poll(min(max(remaining, 0.0), _LIVENESS_CHECK)):
                break
            if self.process.poll() is not None:  # dead, its connection held open elsewhere
                raise WorkerDied(self._ended())
            if remaining <= _LIVENESS_CHECK:
                return None
        try:
            return self.connection.recv()
        except (EOFError, OSError):
            raise WorkerDied(self._ended()) from None

    def _ended(self) -> str:
        try:
            returncode = self.process.wait(_STOP_GRACE)
        except subprocess.TimeoutExpired:  # its end of the pipe closed, yet it lives on
            self.kill()
            return "closed its connection and was killed"
        self.close_pipes()
        return exit_description(returncode)

    def stop(self) -> None:
        try:
            self.connection.send(None)
            self.process.wait(_STOP_GRACE)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.close_pipes()

    def close_pipes(self) -> None:
        self.connection.close()
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1


@dataclass
class _LastCall:
    """The kernel call a lost verdict is attributed to."""

    description: str = ""
    problem: Problem | None = None
    in_progress: bool = False


class _Lost(Exception):
    """The worker died or went silent while answering a request; the finding says how."""

    def __init__(self, finding: str, call: _LastCall) -> None:
        super().__init__(finding)
        self.finding, self.call = finding, call


class Aborted(Exception):
    """The session was aborted (an interrupted ``--jobs`` run): it runs nothing more."""


_Closing = TypeVar("_Closing", bound="_ClosedOnExit")


class _ClosedOnExit:
    """A kernel handle used as ``with handle: ...``: ``close()`` on the way out."""

    def __enter__(self: _Closing) -> _Closing:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        pass


class IsolatedKernel(_ClosedOnExit):
    """A kernel run property by property in a supervised worker (see the module doc)."""

    def __init__(
        self, setup: KernelSetup, options: IsolationOptions | None = None, jobs: int = 1
    ) -> None:
        """``jobs``: how many workers the run has (each gets CPUs // jobs threads)."""
        if isinstance(setup.backend, Backend):  # a loaded library does not pickle
            setup = replace(setup, backend=setup.backend.name, jax_x64=_jax_x64_in_force(setup))
        self.setup, self.options = setup, options or IsolationOptions()
        self.created_at = time.monotonic()  # where the run's --deadline counts from
        self.jobs = jobs
        self.kernel: KernelInfo | None = None
        self._worker: _Worker | None = None
        self._starting: _Worker | None = None  # a worker loading the kernel (see abort)
        # verdicts lost with their worker (a crash, an exit or a hang) during a kernel
        # call: a worker that went silent before any or after the kernel returned (its own
        # draws or checks, on a loaded machine) says nothing about the kernel, and must
        # not stop its diagnosis
        self.lost = 0
        self._aborted = False  # abort() was called: no worker is started any more

    def start(self) -> KernelInfo:
        """Start a worker and load the kernel there; :class:`SetupError` if it cannot."""
        if self.kernel is None:
            self._worker, self.kernel = self._spawn()
        return self.kernel

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def abort(self) -> None:
        """Kill the worker now, from any thread (an interrupted ``--jobs`` run): the request
        it was answering ends as lost, and its thread reads that as the end; a request
        after it (the next re-run of a verdict being settled) raises :class:`Aborted`
        instead of starting a worker again."""
        self._aborted = True  # before reading _starting: _spawn sets that, then reads this
        for worker in (self._worker, self._starting):
            if worker is not None and worker.process.poll() is None:
                with contextlib.suppress(OSError):
                    worker.process.kill()

    def setup_notes(self) -> tuple[str, ...]:
        """What the worker's backend changed and could not check (``setup_notes``)."""
        return self.start().setup_notes

    def worker_start(self) -> WorkerStart:
        """What a worker is sent to start (:func:`.worker.serve` reads it);
        :class:`SetupError` when the setup cannot be pickled for the kernel's process."""
        try:
            payload = _dumps((self.setup, self.options.memory_limit_gib))
        except Exception as exc:
            raise SetupError(
                f"the kernel setup cannot be sent to a worker process ({type(exc).__name__}: "
                f"{exc}); check a MODULE:FUNC or file.py:FUNC target, or run in-process "
                "(--no-isolate, isolate=False)"
            ) from None
        return WorkerStart(
            payload,
            self.options.memory_limit_gib,
            self._judge_setup(),
            self.options.timeout,
            self.options.load_timeout,
            self.options.judge,
        )

    def _spawn(self) -> tuple[_Worker, KernelInfo]:
        start = self.worker_start()
        # the kernel's printing goes where this process routes it (kernel_output_to)
        worker = self._starting = _Worker(kernel_output_fd(), self.jobs)
        limit = max(self.options.timeout, self.options.load_timeout)
        try:
            if self._aborted:  # abort() ran before it could see this worker
                raise Aborted(f"loading kernel {self.setup.kernel!r}: the run was aborted")
            worker.connection.send(start)
            message = worker.receive(limit + self.options.load_timeout)
        except (WorkerDied, BrokenPipeError) as died:
            worker.kill()
            raise SetupError(
                f"loading kernel {self.setup.kernel!r}: the worker process {died} "
                "(at import?): nothing was checked"
            ) from None
        except BaseException:
            worker.kill()
            raise
        finally:
            self._starting = None
        if message is None:
            worker.kill()
            raise SetupError(
                f"loading kernel {self.setup.kernel!r} did not finish within "
                f"{limit:g} s (at import?): nothing was checked"
            )
        if message[0] != "ready":
            worker.kill()
            raise SetupError(message[1])
        return worker, message[1]

    def _judge_setup(self) -> KernelSetup:
        """The setup as the judging worker gets it: everything but the kernel itself (a
        callable there would import the kernel's module where the kernel is judged); the
        kernel's own process gets the whole setup."""
        kernel = self.setup.kernel
        # the claims may hold the kernel's own callables (--linear file.py:phi): not sent
        return replace(
            self.setup, kernel=kernel if isinstance(kernel, str) else "<callable>", claims={}
        )

    @property
    def _judge_timeout(self) -> float:
        """How long the supervisor waits on its worker: the worker ends a kernel call that
        outlasts ``timeout`` itself, and may then start a new kernel process; this only
        catches a worker that stopped answering (a bug of the suite's)."""
        return self.options.timeout + self.options.load_timeout + 30.0

    def _request(self, request: tuple[Any, ...]) -> Any:
        """Send ``request`` to a live worker and return its answer; the kernel calls it
        makes on the way are watched.  :class:`_Lost` when the worker dies or a call (or
        the work between calls) outlasts the timeout: the worker is then gone."""
        if self._aborted:
            raise Aborted(f"{request[0]} request to an aborted worker: the run was aborted")
        self.start()
        if self._worker is None:  # the last one died: a fresh worker for this request
            self._worker, _ = self._spawn()
        worker, call = self._worker, _LastCall()
        try:
            worker.send(request)
            while True:
                message = worker.receive(self._judge_timeout)
                if message is None:
                    self._worker = None
                    worker.kill()
                    raise _Lost(self._hang_finding(call), call)
                kind = message[0]
                if kind == "call":
                    call = _LastCall(message[1], message[2], in_progress=True)
                elif kind == "returned":
                    call.in_progress = False
                elif kind == "answer":
                    return message[1]
                else:  # "setup-error": the worker cannot do this at all
                    self._worker = None
                    worker.kill()
                    raise SetupError(message[1])
        except WorkerDied as died:
            self._worker = None
            raise _Lost(self._death_finding(str(died), call), call) from None
        except (_Lost, SetupError):
            raise
        except BaseException:  # Ctrl-C, SIGTERM: the request stays unanswered
            self._worker = None
            worker.kill()
            raise

    def run_property(
        self, prop: Property, *, profile: str, seed: int | None, limits: SizeLimits | None = None
    ) -> Verdict:
        """One property's verdict; a worker that dies or hangs on it gives a FAILED one.
        The worker draws the same strata, within the same ``limits``, from the same seeds
        as :func:`~.runner.run_property` in this process would."""
        kernel, started = self.start(), time.perf_counter()
        try:
            # The supervisor's profile table is the one that counts (tests shrink it).
            verdict: Verdict = self._request(
                ("property", prop.id, profile, PROFILES.get(profile), seed, limits or SizeLimits())
            )
        except _Lost as lost:
            self.lost += lost.call.in_progress
            return self._lost(prop, lost.finding, lost.call, started, kernel)
        return verdict

    def run_hints(self, failures: int, raised: bool = False) -> list[str]:
        """``hints.run_hints`` in the worker (it calls the kernel); none when the worker
        dies or hangs on them, and none for a kernel that already crashed, exited or hung
        (probing it could cost another timeout, and a convention hint would not explain
        that).  A hint is advice: the verdicts already say what happened."""
        if self.lost:
            return []
        try:
            return list(self._request(("hints", failures, raised)))
        except _Lost:
            return []

    def _hang_finding(self, call: _LastCall) -> str:
        """Why a worker that stopped answering was stopped.  The kernel cannot be the cause
        alone: the worker ends a kernel call that outlasts ``timeout`` itself (the kernel
        runs in its own process), so what stalled is the judging worker's own work."""
        limit = f"{self._judge_timeout:g} s (--timeout + the load timeout + 30 s)"
        if call.in_progress:
            what = (
                f"the judging worker sent nothing for {limit} during a kernel call on the "
                "inputs below, though it ends a kernel call that outlasts --timeout itself"
            )
        elif call.description:
            what = (
                f"the judging worker sent nothing for {limit} after the kernel returned on "
                "the inputs below: judging its result (reference, bound, comparison) did "
                "not finish"
            )
        else:
            what = (
                f"the judging worker sent nothing for {limit} before any kernel call of the "
                "property: drawing its inputs did not finish"
            )
        return f"{what}; the check stopped the worker and went on [CONF-5]"

    @staticmethod
    def _death_finding(how: str, call: _LastCall) -> str:
        if call.in_progress:
            when = "during a kernel call, on the inputs below"
        elif call.description:
            when = (
                "after the kernel returned on the inputs below, while the suite checked its result"
            )
        else:
            when = "before the kernel was called"
        return (
            f"the worker process running the kernel {how}, {when}; the check started a "
            "new worker and went on [CONF-5]"
        )

    @staticmethod
    def _lost(
        prop: Property, finding: str, call: _LastCall, started: float, kernel: KernelInfo
    ) -> Verdict:
        verdict = _failed_verdict(
            prop, PropertyFailure(finding, call.problem, kernel), lost_control=True
        )
        verdict.counterexample = verdict.counterexample or call.description
        verdict.seconds = time.perf_counter() - started
        return verdict


def _jax_x64_in_force(setup: KernelSetup) -> bool | None:
    """The worker's ``jax_x64`` for a setup given a loaded :class:`Backend`: JAX's x64
    setting is process-wide, so a worker checks in the one in force here."""
    backend = setup.backend
    if setup.jax_x64 is not None or not isinstance(backend, Backend) or backend.name != "jax":
        return setup.jax_x64
    # JAX offers float64 only with x64 on (backends/_registry.py)
    return True if "float64" in backend.dtype_names else None


# an in-process run's report says what it is not: the verdicts were decided where the
# kernel ran, so the kernel could have changed them
JUDGED_IN_THE_KERNELS_PROCESS = (
    "judged in the kernel's own process (--no-isolate, isolate=False), where the kernel could "
    "have forged these verdicts; an isolated check judges where it cannot reach [CONF-14]"
)


class InProcessKernel(_ClosedOnExit):
    """The kernel loaded and run in this process (``--no-isolate``): a debugger can step
    into it; a crash, exit or hang of the kernel is the check's too."""

    def __init__(self, setup: KernelSetup, kernel: KernelUnderTest | None = None) -> None:
        self.setup, self.kernel = setup, kernel
        self._loader = ""

    def start(self) -> KernelUnderTest:
        if self.kernel is None:
            self.kernel = self.setup.prepare()
        if not self._loader:  # a kernel given ready-made is reproduced as this setup builds it
            self._loader = self.kernel.loader = loader_source(self.setup, self.kernel)
        return self.kernel

    def setup_notes(self) -> list[str]:
        return [*setup_notes(self.start()), JUDGED_IN_THE_KERNELS_PROCESS]

    def run_property(
        self, prop: Property, *, profile: str, seed: int | None, limits: SizeLimits | None = None
    ) -> Verdict:
        return run_property(prop, self.start(), profile=profile, seed=seed, limits=limits)

    def run_hints(self, failures: int, raised: bool = False) -> list[str]:
        """``hints.run_hints``: probes the kernel, here in this process."""
        return run_hints(self.start(), self.setup.layout, failures, raised)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
