"""The worker side of an isolated check, and the guard every kernel call runs under.

:mod:`.isolation` starts this module in a fresh interpreter.  The worker loads the kernel
from the :class:`~.kernel_setup.KernelSetup` it is sent (so an exit, crash or hang while importing
the kernel's module ends this process, not the check), then runs whole properties and
sends back one :class:`~.runner.Verdict` each.  Before and after every kernel call it
tells its supervisor which inputs the kernel is working on: that is what a per-call
timeout is measured against, and what a verdict names when the process dies mid-call.

Every kernel call, here and in-process, runs under :func:`.call_guard.guard_calls`.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from ...backends import Backend
from ...backends._registry import numpy_namespace
from ..call.side_effects import hypothesis_storage_elsewhere, kernel_output_to
from ..judge.call_guard import CallObserver, guard_calls
from ..judge.failures import PropertyFailure
from ..judge.kernel import KernelUnderTest
from ..judge.kernel_info import KernelInfo
from .thread_variables import THREAD_VARIABLES, WORKER_THREADS

if TYPE_CHECKING:
    from ..call.problem import Problem
    from .kernel_setup import WorkerStart
    from .remote_kernel import KernelProcess

# A reproduction is only built for inputs this small; larger ones are described by shape.
MAX_SENT_PROBLEM_BYTES = 256 * 1024
GIB = 2**30


def problem_worth_sending(problem: Problem | None) -> Problem | None:
    """``problem`` when small enough to be a reproduction, else None (described by shape)."""
    if problem is None:
        return None
    arrays = [problem.q, problem.k, problem.v, problem.mask, problem.bias]
    size = sum(a.nbytes for a in arrays if a is not None)
    return problem if size <= MAX_SENT_PROBLEM_BYTES else None


class _Reporter(CallObserver):
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def started(self, description: str, problem: Problem | None) -> None:
        self.connection.send(("call", description, problem_worth_sending(problem)))

    def returned(self) -> None:
        self.connection.send(("returned",))


def limit_memory(backend: Any, gib: float) -> str:
    """Cap this process's address space at what it maps now plus ``gib`` GiB; a note for
    MemoryError messages ("" when no limit is applied: ``gib`` 0, a device other than the
    CPU (GPU runtimes reserve address space that such a limit would break), or no
    /proc/self/status to measure from)."""
    if gib <= 0 or "cpu" not in str(backend.device).lower():
        return ""
    try:
        import resource

        with open("/proc/self/status", encoding="ascii") as status:
            mapped_kib = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = mapped_kib * 1024 + int(gib * GIB)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, OSError, StopIteration, ValueError):
        return ""
    return (
        f"the check's worker process may allocate at most {gib:g} GiB beyond the loaded "
        "backend: --memory-limit GIB, 0 for none"
    )


def kernel_in_judge(info: KernelInfo, process: KernelProcess, backend: Backend) -> KernelUnderTest:
    """The kernel loaded in ``process``, as the judge calls it: a :class:`KernelUnderTest`
    whose function is a :class:`~.remote_kernel.RemoteFunction` (every call goes to the
    kernel's process), with the claims, loader and hints that process read off it."""
    from .remote_kernel import RemoteFunction, declaration_in_judge

    declaration = declaration_in_judge(info.declaration, process, backend)
    kernel = KernelUnderTest(RemoteFunction(process, backend), backend, declaration, info.target)
    kernel.loader = info.loader
    kernel.setup_hints = list(info.setup_hints)
    guard_calls(kernel).memory_note = info.memory_note
    return kernel


def use_worker_threads(environ: Any = None) -> str:
    """Give PyTorch's intra-op pool (when loaded) the thread count the supervisor chose
    (``isolation.worker_threads``; BLAS and OpenMP read theirs from the environment when
    they load) and say what this worker runs with, for the report's notes."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(WORKER_THREADS)
    torch = sys.modules.get("torch")
    if chosen is not None and torch is not None:
        torch.set_num_threads(int(chosen))
    pytorch = f", PyTorch {torch.get_num_threads()}" if torch is not None else ""
    if chosen is not None:
        return (
            f"worker threads: {chosen} per worker process ({', '.join(THREAD_VARIABLES)}"
            f"{pytorch}): the CPUs this check may use divided by --jobs; set "
            "OMP_NUM_THREADS to choose"
        )
    given = ", ".join(f"{name}={environ[name]}" for name in THREAD_VARIABLES if name in environ)
    return f"worker threads: as the environment sets them ({given}{pytorch})" if given else ""


# glibc's mallopt parameters (malloc.h) and what the judging worker sets them to.
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
# arrays up to this size from the heap, not each from fresh pages: the first that glibc
# takes (one whose threshold is capped at half its heap size, 32 MiB, refuses the larger);
# a decode problem's TOL-2 bound builds a 72 MiB table of its values (6 x 4096 x 384)
_MMAP_THRESHOLDS = (256 * 2**20, 32 * 2**20)
_JUDGE_MALLOC = (
    # freed memory kept for the next example's arrays, not handed back and faulted in again
    (_M_TRIM_THRESHOLD, 512 * 2**20),
    (_M_TOP_PAD, 64 * 2**20),
)


def keep_freed_memory() -> bool:
    """Let glibc's allocator reuse the memory of freed arrays in this process instead of
    returning it to the OS: the judging worker allocates and frees arrays of a few MiB at
    every example (draws, copies, the reference and its bound), and with glibc's defaults
    each comes from fresh zeroed pages, faulted in one by one (a third of the worker's CPU
    time went to the kernel's page faults, issue 33).  The judging worker and the kernel's
    process (which copies every call's inputs and results as they cross).  False where
    there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        threshold = any(libc.mallopt(_M_MMAP_THRESHOLD, value) == 1 for value in _MMAP_THRESHOLDS)
        kept = [libc.mallopt(option, value) == 1 for option, value in _JUDGE_MALLOC]
        return threshold and all(kept)
    except (OSError, AttributeError):
        return False


def no_huge_page_advice(environ: Any = None) -> bool:
    """Stop NumPy asking for transparent huge pages on each buffer of 4 MiB or more in this
    process, unless ``NUMPY_MADVISE_HUGEPAGE`` says otherwise: where the kernel's THP
    defrag setting is "madvise" (a common default) every such allocation may compact
    memory first, in system time (tests/conftest.py measured a quick check at 33 s of CPU
    with it, 20 s without).  Where :func:`keep_freed_memory` applies.
    False where NumPy has no such switch or the environment sets the variable."""
    environ = os.environ if environ is None else environ
    if "NUMPY_MADVISE_HUGEPAGE" in environ:
        return False
    import numpy as np

    core = getattr(np, "_core", None) or getattr(np, "core", None)
    switch = getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)
    if switch is None:
        return False
    switch(False)
    return True


def exit_when_orphaned(lifeline: int) -> None:
    """End this process when the one that started it dies (its end of the pipe closes):
    a judging worker when its supervisor does, the kernel's process when its judge does."""

    def watch() -> None:
        while os.read(lifeline, 1):
            pass
        os._exit(70)

    threading.Thread(target=watch, name="attnspec-lifeline", daemon=True).start()


def kernel_process_for(start: WorkerStart) -> KernelProcess:
    """The kernel's process a judge holds (not started yet), as ``start`` describes it: the
    one constructor of it, for :func:`serve` and for a test that judges in its own process
    with the kernel in a process of its own (tests/support.py)."""
    from .remote_kernel import KernelProcess

    return KernelProcess(
        start.setup_bytes,
        start.memory_limit_gib,
        timeout=start.timeout,
        load_timeout=start.load_timeout,
        label=f"kernel {start.judge_setup.kernel!r}",
    )


def serve(connection: Connection) -> None:
    """Start the kernel's process, then answer requests until told to stop (the judge's
    main loop): ``("property", id, profile, examples, seed, limits)`` gets the property's
    verdict, ``("hints", failures, raised)`` the hints from probing the kernel
    (:func:`.convention_hints.run_hints`).  The kernel runs in a process of its own
    (:mod:`.kernel_process`); this one draws, calls it there, and judges."""
    from .kernel_setup import SetupError

    keep_freed_memory()
    no_huge_page_advice()
    # the judge draws and computes the reference on NumPy whatever the kernel's backend:
    # its namespace imported here, without the NumPy tools a plain import would load
    numpy_namespace()
    start: WorkerStart = connection.recv()
    judge_setup = start.judge_setup
    process = kernel_process_for(start)
    try:
        try:
            # the kernel's process first: a setup it refuses (a dtype the backend lacks,
            # a module that fails to import) costs this process no backend import (JAX:
            # ~1 CPU-s); it makes the same backend, so it meets an unusable one first too
            info, _ = process.start()
            backend = judge_setup.make_backend()
        except SetupError as exc:
            connection.send(("setup-error", str(exc)))
            return
        kernel = kernel_in_judge(info, process, backend)
        kernel.fn.twice_and_recheck = start.strict  # type: ignore[attr-defined]
        threads = use_worker_threads()
        if threads:
            info = replace(info, setup_notes=(*info.setup_notes, threads))
        connection.send(("ready", info))
        # what was loaded so far (the library, the suite) lives as long as this worker:
        # kept out of the collector's full passes (~7 a quick profile, 0.1 s each)
        gc.freeze()
        guard = guard_calls(kernel)
        guard.observer = _Reporter(connection)
        guard.interrupt_is_the_kernels = True
        with kernel_output_to(sys.stdout), hypothesis_storage_elsewhere():
            while True:
                request = connection.recv()
                if request is None:
                    return
                if request[0] == "hints" and process.lost:
                    # the kernel hung or its process died: probing it could cost another
                    # timeout, and a convention hint would not explain that
                    connection.send(("answer", []))
                    continue
                answer = _answer_or_no_hints(request, process, kernel, judge_setup.layout)
                if isinstance(answer, str):
                    connection.send(("setup-error", answer))
                    return
                connection.send(("answer", answer[0]))
    finally:
        process.end()


def _answer_or_no_hints(
    request: tuple[Any, ...], process: KernelProcess, kernel: KernelUnderTest, layout: str
) -> tuple[Any] | str:
    """:func:`_answer`; for the hints, none once the kernel hangs or its process dies while
    probed, as when it was lost before (the other probes are not made: each would start
    a process again, ~15 of them for a kernel that crashes on every probe)."""
    if request[0] != "hints":
        return _answer(request, kernel, layout)
    lost, process.restarts = process.lost, False
    try:
        answer = _answer(request, kernel, layout)
    finally:
        process.restarts = True
    return ([],) if process.lost > lost else answer


def _answer(request: tuple[Any, ...], kernel: KernelUnderTest, layout: str) -> tuple[Any] | str:
    """(the answer to ``request``,), or why the worker cannot answer it (a setup error)."""
    from ..judge.convention_hints import run_hints
    from ..judge.registry import all_properties
    from .property_runner import PROFILES, _failed_verdict, run_property

    if request[0] == "hints":
        return (run_hints(kernel, layout, *request[1:]),)
    _, prop_id, profile, examples, seed, limits = request
    if examples is not None:
        PROFILES[profile] = examples
    registry = all_properties()
    if prop_id not in registry:
        return (
            f"property {prop_id!r} is not registered in the worker process (registered "
            "at run time? use --no-isolate)"
        )
    prop = registry[prop_id]
    try:
        verdict = run_property(prop, kernel, profile=profile, seed=seed, limits=limits)
    except BaseException as exc:  # e.g. sys.exit from a result's __array__: a verdict
        verdict = _failed_verdict(
            prop,
            PropertyFailure(
                f"checking the kernel's result raised {type(exc).__name__}: {str(exc)[:300]}"
            ),
        )
    return (verdict,)


def serve_until_orphaned(serve: Callable[[Connection], None], argv: list[str] | None) -> None:
    """The ``main`` of a process another one starts (a judging worker, the kernel's
    process): ``argv`` is ``FD LIFELINE``; serve the connection on FD until it closes (or
    the process that started this one goes away: LIFELINE), then exit."""
    fd, lifeline = (int(a) for a in (argv or sys.argv[1:]))
    exit_when_orphaned(lifeline)
    connection = Connection(fd)
    try:
        serve(connection)
    except (EOFError, BrokenPipeError):
        pass  # the process that started this one went away or stopped it
    connection.close()
    sys.stdout.flush()
    # Skip interpreter teardown: a kernel's atexit hooks or threads are not the check's.
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    """``python -c 'from attnspec.conformance.run.worker import main; main()' FD LIFELINE``."""
    serve_until_orphaned(serve, argv)
