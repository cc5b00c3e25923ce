"""Running a kernel in a supervised worker process, so no kernel can take the check down.

The check's own process (the supervisor) never imports the kernel.  It starts a worker
(:mod:`.worker`, a fresh interpreter with the same ``sys.path``), sends it the
:class:`~.api.KernelSetup`, and asks it for one whole property at a time; the worker
answers with the :class:`~.runner.Verdict`.  While a property runs, the worker reports
the start and return of every kernel call with the inputs of that call, so that:

* a crash, a signal (segfault, the out-of-memory killer) or any exit of the worker, exit
  status 0 included, becomes a FAILED verdict for the property that was running, naming
  what happened and the inputs of the call under way;
* a kernel call that does not return within ``timeout`` seconds (and equally a stretch of
  the suite's own work between calls that does not finish, e.g. converting a result that
  never becomes ready) becomes a FAILED verdict naming those inputs;

and in either case the worker is replaced and the check goes on with the next property.
The worker also caps its address space (``memory_limit_gib``), so a kernel that asks for
50 GB gets a ``MemoryError`` (a FAILED verdict) instead of exhausting the machine.

:func:`open_session` gives the same interface for an in-process run (``--no-isolate``),
where a debugger can step into the kernel and nothing is protected.  The unit of work is
a whole property, so several workers can later share a list of properties.
"""

from __future__ import annotations

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
from dataclasses import dataclass, replace
from typing import Any

from ..backends import Backend
from .api import KernelSetup, SetupError, with_loader
from .declaration import KernelDeclaration
from .failures import PropertyFailure
from .kernel import KernelUnderTest, Problem, load_kernel
from .registry import Property
from .runner import PROFILES, Verdict, _failed_verdict, run_property

DEFAULT_TIMEOUT = 60.0  # s per kernel call: JAX/XLA compiles a new shape in a few seconds
DEFAULT_MEMORY_LIMIT_GIB = 16.0  # beyond the loaded backend; quick problems need megabytes
DEFAULT_LOAD_TIMEOUT = 120.0  # s to start a worker and import the backend and the kernel
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

    def __post_init__(self) -> None:
        for name in ("timeout", "load_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value!r}, but should be a positive number of "
                                 "seconds")
        if not (isinstance(self.memory_limit_gib, (int, float))
                and math.isfinite(self.memory_limit_gib) and self.memory_limit_gib >= 0):
            raise ValueError(f"memory_limit_gib={self.memory_limit_gib!r}, but should be a "
                             "number of GiB >= 0 (0: no limit)")


@dataclass(frozen=True)
class BackendInfo:
    name: str
    device: str


@dataclass(frozen=True)
class KernelInfo:
    """What the supervisor knows of a kernel loaded in a worker: enough for the report,
    the conformance claim, rerun commands and reproductions (duck-types the parts of
    :class:`KernelUnderTest` those use)."""

    target: str
    backend: BackendInfo
    declaration: KernelDeclaration
    dtypes: tuple[str, ...]
    loader: str
    memory_note: str = ""

    @classmethod
    def of(cls, kernel: KernelUnderTest, loader: str, memory_note: str) -> KernelInfo:
        declaration = kernel.declaration
        linear = declaration.linear
        if linear is not None and callable(linear.feature_map):
            # Unpickling the function would import the kernel's module in the supervisor.
            stand_in = CallableInWorker(getattr(linear.feature_map, "__qualname__", "?"))
            declaration = replace(declaration, linear=replace(linear, feature_map=stand_in))
        return cls(kernel.target, BackendInfo(kernel.backend.name, str(kernel.backend.device)),
                   declaration, kernel.dtypes, loader, memory_note)


@dataclass(frozen=True)
class CallableInWorker:
    """Stands in the supervisor for a callable (a feature map) that lives in the worker."""

    name: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self.name} runs in the check's worker process, not here")


class _SetupPickler(pickle.Pickler):
    """Pickles functions from ``file.py:FUNC`` modules as ``load_kernel("file.py:FUNC")``:
    their module's name is private to the process that loaded them."""

    def reducer_override(self, obj: Any) -> Any:
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        if (isinstance(obj, types.FunctionType) and module is not None
                and module.__name__.startswith(FILE_MODULE_PREFIX) and module.__file__):
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


class _Worker:
    """One worker process and the connection to it."""

    def __init__(self) -> None:
        self.connection, child = multiprocessing.Pipe()
        lifeline_read, self._lifeline = os.pipe()
        code = (f"import sys; sys.path[:] = {sys.path!r}; "
                "from attnspec.conformance.worker import main; main()")
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, str(child.fileno()), str(lifeline_read)],
            pass_fds=(child.fileno(), lifeline_read), stdin=subprocess.DEVNULL,
            stdout=2,  # the kernel's own printing never lands in the table on stdout
            start_new_session=True,  # Ctrl-C is the supervisor's to handle, not the kernel's
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


class IsolatedKernel:
    """A kernel run property by property in a supervised worker (see the module doc)."""

    def __init__(self, setup: KernelSetup, options: IsolationOptions | None = None) -> None:
        if isinstance(setup.backend, Backend):  # a loaded library does not pickle
            setup = replace(setup, backend=setup.backend.name)
        self.setup, self.options = setup, options or IsolationOptions()
        self.kernel: KernelInfo | None = None
        self._worker: _Worker | None = None

    def __enter__(self) -> IsolatedKernel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> KernelInfo:
        """Start a worker and load the kernel there; :class:`SetupError` if it cannot."""
        if self.kernel is None:
            self._worker, self.kernel = self._spawn()
        return self.kernel

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def _spawn(self) -> tuple[_Worker, KernelInfo]:
        try:
            payload = _dumps((self.setup, self.options.memory_limit_gib))
        except Exception as exc:
            raise SetupError(
                f"the kernel setup cannot be sent to a worker process ({type(exc).__name__}: "
                f"{exc}); check a MODULE:FUNC or file.py:FUNC target, or run in-process "
                "(--no-isolate, isolate=False)"
            ) from None
        worker = _Worker()
        limit = max(self.options.timeout, self.options.load_timeout)
        try:
            worker.connection.send_bytes(payload)
            message = worker.receive(limit)
        except (WorkerDied, BrokenPipeError) as died:
            worker.kill()
            raise SetupError(f"loading kernel {self.setup.kernel!r}: the worker process {died} "
                             "(at import?): nothing was checked") from None
        except BaseException:
            worker.kill()
            raise
        if message is None:
            worker.kill()
            raise SetupError(f"loading kernel {self.setup.kernel!r} did not finish within "
                             f"{limit:g} s (at import?): nothing was checked")
        if message[0] != "ready":
            worker.kill()
            raise SetupError(message[1])
        return worker, message[1]

    def run_property(self, prop: Property, *, profile: str, seed: int | None) -> Verdict:
        """One property's verdict; a worker that dies or hangs on it gives a FAILED one."""
        kernel = self.start()
        if self._worker is None:  # the last one died: a fresh worker for this property
            self._worker, _ = self._spawn()
        worker, started, call = self._worker, time.perf_counter(), _LastCall()
        try:
            # The supervisor's profile table is the one that counts (tests shrink it).
            worker.send((prop.id, profile, PROFILES.get(profile), seed))
            while True:
                message = worker.receive(self.options.timeout)
                if message is None:
                    self._worker = None
                    worker.kill()
                    return self._lost(prop, self._hang_finding(call), call, started, kernel)
                kind = message[0]
                if kind == "call":
                    call = _LastCall(message[1], message[2], in_progress=True)
                elif kind == "returned":
                    call.in_progress = False
                elif kind == "verdict":
                    return message[1]
                else:  # "setup-error": the worker cannot run this property at all
                    self._worker = None
                    worker.kill()
                    raise SetupError(message[1])
        except WorkerDied as died:
            self._worker = None
            return self._lost(prop, self._death_finding(str(died), call), call, started, kernel)
        except BaseException:  # Ctrl-C, SIGTERM: the property stays unfinished
            self._worker = None
            worker.kill()
            raise

    def _hang_finding(self, call: _LastCall) -> str:
        limit = f"{self.options.timeout:g} s (--timeout SECONDS)"
        if call.in_progress:
            what = f"the kernel did not return within {limit} on the inputs below"
        elif call.description:
            what = (f"nothing happened for {limit} after the kernel returned on the inputs "
                    "below: converting or checking its result did not finish")
        else:
            what = f"no kernel call started within {limit} of the property starting"
        return f"{what}; the check stopped its worker process and went on [CONF-5]"

    @staticmethod
    def _death_finding(how: str, call: _LastCall) -> str:
        if call.in_progress:
            when = "during a kernel call, on the inputs below"
        elif call.description:
            when = ("after the kernel returned on the inputs below, while the suite checked "
                    "its result")
        else:
            when = "before the kernel was called"
        return (f"the worker process running the kernel {how}, {when}; the check started a "
                "new worker and went on [CONF-5]")

    @staticmethod
    def _lost(prop: Property, finding: str, call: _LastCall, started: float,
              kernel: KernelInfo) -> Verdict:
        verdict = _failed_verdict(prop, PropertyFailure(finding, call.problem, kernel))  # type: ignore[arg-type]
        verdict.counterexample = verdict.counterexample or call.description
        verdict.reproduction = with_loader(verdict.reproduction, kernel.loader)
        verdict.seconds = time.perf_counter() - started
        return verdict


class InProcessKernel:
    """The kernel loaded and run in this process (``--no-isolate``): a debugger can step
    into it; a crash, exit or hang of the kernel is the check's too."""

    def __init__(self, setup: KernelSetup, kernel: KernelUnderTest | None = None) -> None:
        self.setup, self.kernel = setup, kernel
        self._loader = ""

    def __enter__(self) -> InProcessKernel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> KernelUnderTest:
        if self.kernel is None:
            self.kernel = self.setup.prepare()
        self._loader = self._loader or self.setup.loader_source(self.kernel)
        return self.kernel

    def close(self) -> None:
        pass

    def run_property(self, prop: Property, *, profile: str, seed: int | None) -> Verdict:
        verdict = run_property(prop, self.start(), profile=profile, seed=seed)
        verdict.reproduction = with_loader(verdict.reproduction, self._loader)
        return verdict


def open_session(
    setup: KernelSetup, isolation: IsolationOptions | None,
    kernel: KernelUnderTest | None = None,
) -> IsolatedKernel | InProcessKernel:
    """Isolated when ``isolation`` is given (then ``kernel`` must be None), else in-process."""
    if isolation is None:
        return InProcessKernel(setup, kernel)
    if kernel is not None:
        raise ValueError("kernel=, a kernel loaded in this process, cannot run isolated; "
                         "pass isolation=None")
    return IsolatedKernel(setup, isolation)
