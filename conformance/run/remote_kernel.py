"""The judge's side of the kernel's process: start it, call the kernel there, end it.

:class:`KernelProcess` starts :mod:`.kernel_process` in a fresh interpreter, in a session
(process group) of its own and with a temporary directory of its own, and hands it the
kernel's setup.  :class:`RemoteFunction` is the kernel as the judge holds it: calling it
sends the arguments as plain data, waits at most ``timeout`` seconds, and rebuilds the
result as fresh arrays (:mod:`..call.wire`).  A call that does not return in time ends
the kernel's process group (whatever the kernel started with it) and raises
:class:`~..judge.failures.KernelStalled`; a process that dies raises
:class:`~..judge.failures.KernelProcessDied`; either way the next call starts a fresh
process.  Every process the kernel started is ended with it, and its temporary directory
is removed: nothing the kernel left behind outlives the check.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import multiprocessing
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from typing import Any

import numpy as np

from ...backends import Backend
from ...backends.exchange import ArrayPayload
from ..call.gradients import BackwardCall
from ..call.wire import (
    CallableInKernelProcess,
    RaisedRemotely,
    export_value,
    float_bits,
    import_value,
    named_arguments,
    receive_message,
    send_message,
)
from ..claims.declaration import KernelDeclaration
from ..judge.failures import (
    InputsChangedLater,
    KernelProcessDied,
    KernelStalled,
    PropertyFailure,
)
from ..judge.kernel_info import KernelInfo

_STOP_GRACE = 2.0  # s a stopped kernel process gets to exit before it is killed
_LIVENESS_CHECK = 0.5  # s between checks that a silent kernel process is alive
_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the one that inherits its descendants orphaned by their parent's
    end (Linux's PR_SET_CHILD_SUBREAPER), so a process the kernel started and detached
    (a new session, a double fork) is still found and ended (:func:`end_orphans`).
    False where the OS has no such setting."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc; empty where there is none)."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def end_orphans(keep: set[int]) -> int:
    """Kill (with their process groups) this process's children other than ``keep``: the
    kernel's descendants that were reparented here (see :func:`become_subreaper`), and
    reap them.  Returns how many were ended."""
    ended = 0
    for pid in children_of(os.getpid()):
        if pid in keep:
            continue
        with contextlib.suppress(OSError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)
        ended += 1
    return ended


class KernelProcess:
    """One kernel process at a time for one judge; restarted after a hang or a death."""

    def __init__(
        self,
        setup_bytes: bytes,
        memory_limit_gib: float,
        *,
        timeout: float,
        load_timeout: float,
        environment: dict[str, str] | None = None,
        label: str = "the kernel",
    ) -> None:
        self.setup_bytes, self.memory_limit_gib = setup_bytes, memory_limit_gib
        self.timeout, self.load_timeout = timeout, load_timeout
        self.environment = dict(environment or {})
        self.label = label  # how a setup error names the kernel: "kernel 'mod:fn'"
        self.process: subprocess.Popen[bytes] | None = None
        self.connection: Any = None
        self._lifeline = -1
        self.tmpdir = ""
        self.info: KernelInfo | None = None
        self.extras: dict[str, Any] = {}
        self.starts = 0
        self.lost = 0  # calls that stalled or whose process died
        # False: a process lost is not started again, each request raises at once (the
        # hint probes, which a lost kernel ends: see worker.serve)
        self.restarts = True
        become_subreaper()

    # -- life --------------------------------------------------------------------------

    def start(self) -> tuple[KernelInfo, dict[str, Any]]:
        """Start the process and load the kernel; ("setup-error", message) is raised as
        :class:`SetupError` by the caller from the returned message."""
        from .kernel_setup import SetupError

        self.connection, child = multiprocessing.Pipe()
        lifeline_read, self._lifeline = os.pipe()
        self.tmpdir = tempfile.mkdtemp(prefix="attnspec-kernel-")
        code = (
            f"import sys; sys.path[:] = {sys.path!r}; "
            "from attnspec.conformance.run.kernel_process import main; main()"
        )
        environ = {**os.environ, **self.environment, "TMPDIR": self.tmpdir}
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, str(child.fileno()), str(lifeline_read)],
            pass_fds=(child.fileno(), lifeline_read),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: ended whole
            env=environ,
        )
        child.close()
        os.close(lifeline_read)
        self.starts += 1
        try:
            self.connection.send((self.setup_bytes, self.memory_limit_gib))
            message = self._receive(max(self.timeout, self.load_timeout))
        except KernelProcessDied as died:
            self.end()
            raise SetupError(
                f"loading {self.label}: the process loading it {died.how} (at import?): "
                "nothing was checked"
            ) from None
        except KernelStalled:
            self.end(graceful=False)
            raise SetupError(
                f"loading {self.label} did not finish within "
                f"{max(self.timeout, self.load_timeout):g} s (at import?): nothing was checked"
            ) from None
        if message[0] != "ready":
            self.end()
            raise SetupError(str(message[1]))
        self.info, self.extras = message[1], dict(message[2])
        return self.info, self.extras

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ensure(self) -> None:
        if not self.alive():
            self.end()
            if not self.restarts and self.starts:
                raise KernelProcessDied("was lost, and is not started again for the hint probes")
            self.start()

    def end(self, *, graceful: bool = True) -> None:
        """End the process, its process group and any orphan it left, and remove its
        temporary directory.  ``graceful``: asked to stop first, and given _STOP_GRACE to;
        not for a process stalled in a kernel call, which would not read the request (each
        hang cost the timeout and then the grace, 2 s, before the kill)."""
        process, self.process = self.process, None
        if process is not None:
            if graceful and process.poll() is None and self.connection is not None:
                with contextlib.suppress(OSError):
                    send_message(self.connection, None)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(_STOP_GRACE)
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
            if process.poll() is None:
                process.kill()
            process.wait()
        end_orphans(keep=set())
        if self.connection is not None:
            with contextlib.suppress(OSError):
                self.connection.close()
            self.connection = None
        if self._lifeline >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lifeline)
            self._lifeline = -1
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = ""

    # -- calls -------------------------------------------------------------------------

    def _ended(self) -> str:
        from .supervisor import exit_description

        process = self.process
        if process is None:
            return "was not running"
        try:
            returncode = process.wait(_STOP_GRACE)
        except subprocess.TimeoutExpired:
            return "closed its connection"
        return exit_description(returncode)

    def _receive(self, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                if self.connection.poll(min(max(remaining, 0.0), _LIVENESS_CHECK)):
                    return receive_message(self.connection, deadline, from_kernel=True)
            except TimeoutError:  # the rest of a message that started in time
                raise KernelStalled(timeout) from None
            except (EOFError, OSError):
                raise KernelProcessDied(self._ended()) from None
            except pickle.UnpicklingError as exc:
                raise KernelProcessDied(f"sent a message that is not plain data ({exc})") from None
            if self.process is not None and self.process.poll() is not None:
                raise KernelProcessDied(self._ended())
            if remaining <= _LIVENESS_CHECK:
                raise KernelStalled(timeout)

    def request(self, message: tuple[Any, ...], timeout: float) -> Any:
        """Send ``message`` and return the answer; a stall or a death ends the process
        (the next request starts a new one) and is raised."""
        self.ensure()
        try:
            send_message(self.connection, message)
            return self._receive(timeout)
        except (BrokenPipeError, ConnectionResetError):
            died = KernelProcessDied(self._ended())
            self.lost += 1
            self.end()
            raise died from None
        except (KernelStalled, KernelProcessDied) as lost:
            self.lost += 1
            # a process stalled in a call would not read a request to stop
            self.end(graceful=not isinstance(lost, KernelStalled))
            raise
        except BaseException:  # Ctrl-C while waiting: the process is in an unknown state
            self.end()
            raise


class RemoteFunction:
    """The kernel (or one of its callables) as the judge calls it: in its own process."""

    def __init__(self, process: KernelProcess, backend: Backend, target: str = "kernel") -> None:
        self.process, self.backend, self.target = process, backend, target
        extras = process.extras
        self.__name__ = str(extras.get("name", "kernel"))
        self.__qualname__ = str(extras.get("qualname", self.__name__))
        self.__module__ = str(extras.get("module", ""))
        self.attnspec_libraries_used = frozenset(extras.get("libraries_used", ()))
        self.call_description = ""  # the inputs of the call under way, set by the call guard
        # --judge: each call made twice on fresh copies and compared bit for bit, and the
        # inputs re-read JUDGE_RECHECK_DELAY after each
        self.twice_and_recheck = False
        # seconds the kernel's own calls took in its process (the report's kernel share)
        self.kernel_seconds = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self._call_once(args, kwargs)
        if not self.twice_and_recheck or self.target != "kernel":
            return import_value(self.backend, result)
        changed = self.recheck_inputs(JUDGE_RECHECK_DELAY)
        if changed:
            raise InputsChangedLater(
                f"{', '.join(changed)} changed after the call returned (re-read "
                f"{JUDGE_RECHECK_DELAY * 1000:g} ms later, --judge): the kernel kept working "
                "on its inputs [SDPA-1.6]"
            )
        again = self._call_once(args, kwargs)
        difference = first_difference(result, again)
        if difference:
            raise PropertyFailure(
                "the same call made twice on fresh copies of the same inputs (--judge) "
                f"returned different results: {difference} [SDPA-7.5]"
            )
        return import_value(self.backend, result)

    def vjp(self, call: BackwardCall) -> Any:
        """The kernel's gradients ``(dq, dk, dv, dbias)`` for ``call``, computed in its
        process, in its framework, on its device (:func:`~..call.gradients.kernel_gradients`),
        as fresh arrays here."""
        upstream = (
            export_value(self.backend, call.grad_out),
            call.bias_keyword,
            export_value(self.backend, call.grad_lse),
            call.wrt,
            export_value(self.backend, call.grad_state),
            call.with_output,
        )
        return import_value(self.backend, self._call_once(call.args, call.kwargs, upstream))

    def _call_once(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        upstream: tuple[Any, ...] | None = None,
    ) -> Any:
        """One call (with ``upstream``, a "vjp" request: the gradients); the result as
        plain data (payloads), the kernel's changes to its inputs applied to ``args`` and
        ``kwargs``."""
        exported = (export_value(self.backend, args), export_value(self.backend, kwargs))
        message: tuple[Any, ...] = (
            ("call", self.target, *exported, self.call_description)
            if upstream is None
            else ("vjp", *exported, self.call_description, *upstream)
        )
        answer = self.process.request(message, self.process.timeout)
        kind = answer[0]
        late = answer[-1]
        seconds = answer[-2] if len(answer) > 2 else None
        if isinstance(seconds, float) and 0.0 <= seconds < math.inf:
            self.kernel_seconds += seconds
        if late is not None:
            description, changed = late
            raise InputsChangedLater(
                f"{', '.join(sorted(changed))} of an earlier call"
                f"{f' ({description})' if description else ''} changed after the call "
                "returned: the kernel kept working on its inputs [SDPA-1.6]"
            )
        if kind == "returned":
            result, changed = answer[1], answer[2]
            if changed:
                _write_back(self.backend, args, kwargs, changed)
            return result
        if kind == "raised":
            raised: RaisedRemotely = answer[1]
            raise raised.exception()
        if kind == "exited":
            raise SystemExit(answer[1])
        if kind == "interrupted":
            raise KeyboardInterrupt
        raise KernelProcessDied(f"answered {kind!r}, which is no answer to a call")

    def recheck_inputs(self, delay: float) -> list[str]:
        """The names of the last call's inputs that changed within ``delay`` seconds after
        it returned (empty: none did)."""
        answer = self.process.request(("recheck", delay), self.process.timeout + delay)
        if answer[0] != "rechecked" or answer[1] is None:
            return []
        return sorted(answer[1][1])


# How long after a call --judge re-reads its inputs.
JUDGE_RECHECK_DELAY = 0.005


def first_difference(a: Any, b: Any, where: str = "result") -> str:
    """Where two results (as plain data) first differ bit for bit, in words; "" if equal."""
    if isinstance(a, ArrayPayload) and isinstance(b, ArrayPayload):
        if (a.dtype, a.shape, a.strides) != (b.dtype, b.shape, b.strides):
            return f"{where} is {a.dtype}{a.shape} once and {b.dtype}{b.shape} the other time"
        x, y = np.ascontiguousarray(a.values), np.ascontiguousarray(b.values)
        unequal = float_bits(x) != float_bits(y)
        if unequal.any():
            at = tuple(int(i) for i in np.argwhere(unequal)[0])
            return (
                f"{where}{list(at)} is {x[at]!r} once and {y[at]!r} the other time "
                f"({int(unequal.sum())} of {unequal.size} elements differ)"
            )
        return ""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return ""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        same = isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
        return "" if same and np.array_equal(a, b, equal_nan=True) else f"{where} differs"
    return "" if a == b else f"{where} is {a!r} once and {b!r} the other time"


def _write_back(
    backend: Backend, args: tuple[Any, ...], kwargs: dict[str, Any], changed: dict[str, Any]
) -> None:
    """Apply the kernel's changes to its inputs to the judge's copies, as an in-process call
    would have left them (SDPA-1.6 reads them after the call)."""
    named = named_arguments(args, kwargs)
    for name, payload in changed.items():
        mine = named.get(name)
        if mine is None or not backend.is_array(mine):
            continue
        new = import_value(backend, payload)
        with contextlib.suppress(Exception):  # an array the library cannot write (JAX's)
            mine[...] = new


def declaration_in_judge(
    declaration: KernelDeclaration, process: KernelProcess, backend: Backend
) -> KernelDeclaration:
    """``declaration`` with each callable held in the kernel's process (a feature map)
    made a :class:`RemoteFunction` that calls it there."""
    linear = declaration.linear
    if linear is not None and isinstance(linear.feature_map, CallableInKernelProcess):
        remote = RemoteFunction(process, backend, target=linear.feature_map.name)
        declaration = replace(declaration, linear=replace(linear, feature_map=remote))
    return declaration


__all__ = [
    "KernelProcess",
    "RemoteFunction",
    "become_subreaper",
    "declaration_in_judge",
    "end_orphans",
]
