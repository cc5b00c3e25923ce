"""The guard every kernel call runs under, in a worker process or in this one.

:func:`guard_calls` restores NumPy's floating-point error state after each call, turns
``sys.exit`` inside the kernel (and, in a worker, ``KeyboardInterrupt``) into a failed
verdict (CONF-5), and tells an observer (the worker's supervisor) which inputs each call
works on.  Applied by :meth:`.kernel_setup.KernelSetup.prepare` to every kernel.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .failures import (
    KernelExited,
    KernelHung,
    KernelProcessDied,
    KernelStalled,
    PropertyFailure,
)

if TYPE_CHECKING:
    from ..call.gradients import BackwardCall
    from ..call.problem import Problem
    from .kernel import KernelOutputs, KernelUnderTest


def describe_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Shapes and keywords of a call made with hand-built arguments (no Problem)."""

    def shape(x: Any) -> str:
        return f"{tuple(x.shape)}" if hasattr(x, "shape") else f"={x!r}"[:40]

    names = ("q", "k", "v")[: len(args)]
    parts = [f"{name}{shape(a)}" for name, a in zip(names, args, strict=False)]
    parts += [f"{key}{shape(value)}" for key, value in kwargs.items()]
    return ", ".join(parts)


class CallObserver:
    """Hears each kernel call start and return (the worker tells its supervisor)."""

    def started(self, description: str, problem: Problem | None) -> None:
        pass

    def returned(self) -> None:
        pass


class CallGuard:
    """What wraps ``kernel.call_raw``: see :func:`guard_calls`."""

    def __init__(self, kernel: KernelUnderTest) -> None:
        self.kernel = kernel
        self.observer: CallObserver | None = None
        self.interrupt_is_the_kernels = False
        self.memory_note = ""
        self.problem: Problem | None = None  # the inputs of the call_on() under way
        self._call, self._invoke = kernel.call_raw, kernel.call_on
        self._gradients = kernel.call_gradients

    def call_on(self, problem: Problem) -> KernelOutputs:
        self.problem = problem
        try:
            return self._invoke(problem)
        finally:
            self.problem = None

    def call_gradients(self, call: BackwardCall, problem: Problem | None = None) -> Any:
        """A backward call (spec/backward.md) under the same guard as a forward one."""
        self.problem = problem
        try:
            return self.call_raw(call.args, call.kwargs, lambda: self._gradients(call))
        finally:
            self.problem = None

    def call_raw(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        call: Callable[[], Any] | None = None,
    ) -> Any:
        """``kernel.call_raw(args, kwargs)`` (or ``call()``, a call on those arguments)
        under the guard."""
        problem = self.problem
        fn = self.kernel.fn
        remote = hasattr(fn, "call_description")  # a kernel in its own process
        if self.observer is not None or remote:
            # described once: the supervisor hears it, the kernel's process names the call
            # in a late change to its inputs
            description = (
                self.kernel.describe(problem)
                if problem is not None
                else (describe_call(args, kwargs))
            )
            if self.observer is not None:
                self.observer.started(description, problem)
            if hasattr(fn, "call_description"):
                fn.call_description = description
        # A kernel that leaves np.seterr(all="raise") behind must not turn the suite's own
        # NumPy arithmetic (reference, tolerances) into errors.
        error_state = np.geterr()
        # a kernel in its own process counts the seconds of its calls there (without
        # moving their inputs and results between processes); one here is timed here
        counted_there = getattr(self.kernel.raw_fn, "kernel_seconds", None)
        started = time.perf_counter()
        try:
            return self._call(args, kwargs) if call is None else call()
        except KernelStalled as stalled:
            raise KernelHung(
                PropertyFailure(
                    f"the kernel did not return within {stalled.seconds:g} s (--timeout "
                    "SECONDS) on the inputs below; the check ended the kernel's process (and "
                    "whatever it started) and went on [CONF-5]",
                    problem,
                    self.kernel,
                )
            ) from None
        except KernelProcessDied as died:
            raise KernelExited(
                PropertyFailure(
                    f"the process running the kernel {died.how}, during a kernel call, on the "
                    "inputs below; the check started a new one and went on [CONF-5]",
                    problem,
                    self.kernel,
                )
            ) from None
        except SystemExit as exc:
            raise KernelExited(
                PropertyFailure(
                    f"the kernel called sys.exit({exc.code!r}): a kernel must return a result or "
                    "raise an exception, never end the process [CONF-5]",
                    problem,
                    self.kernel,
                )
            ) from None
        except KeyboardInterrupt:
            if not self.interrupt_is_the_kernels:
                raise  # in-process, Ctrl-C: the user's interrupt, not a verdict
            raise KernelExited(
                PropertyFailure(
                    "the kernel raised KeyboardInterrupt (no one pressed Ctrl-C: the check runs "
                    "the kernel in a worker process that receives no terminal signals) [CONF-5]",
                    problem,
                    self.kernel,
                )
            ) from None
        except MemoryError as exc:
            if self.memory_note:
                raise MemoryError(f"{exc} ({self.memory_note})") from None
            raise
        finally:
            np.seterr(**error_state)
            self.kernel.kernel_seconds += (
                time.perf_counter() - started
                if counted_there is None
                else getattr(self.kernel.raw_fn, "kernel_seconds", 0.0) - counted_there
            )
            if self.observer is not None:
                self.observer.returned()


def guard_calls(kernel: KernelUnderTest) -> CallGuard:
    """Put every call of ``kernel`` under a :class:`CallGuard` (once) and return it.

    The guard wraps this instance's ``call_raw`` (which every call goes through) and
    ``call_on`` (which knows the :class:`Problem`, for messages).  Configure it through the
    returned object: ``observer``, ``interrupt_is_the_kernels``, ``memory_note``.
    """
    existing = kernel.__dict__.get("call_guard")
    if isinstance(existing, CallGuard):
        return existing
    guard = CallGuard(kernel)
    kernel.call_raw, kernel.call_on = guard.call_raw, guard.call_on  # type: ignore[method-assign]
    kernel.call_gradients = guard.call_gradients  # type: ignore[method-assign]
    kernel.call_guard = guard  # type: ignore[attr-defined]
    return guard
