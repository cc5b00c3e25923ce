"""The kernel's own process: it loads the kernel and calls it, and nothing else.

A judge (:mod:`.worker`, or this check's process) starts it with :mod:`.remote_kernel` and
sends it the pickled :class:`~.kernel_setup.KernelSetup`; it loads the kernel (an exit, a
crash or a hang while importing ends this process, not the judge's), answers
``("ready", info)``, then serves calls: the arguments arrive as plain data
(:mod:`..call.wire`), are rebuilt as fresh arrays of the backend in their dtype and memory
layout, the kernel is called, and its result goes back as plain data, with the seconds
the kernel's call took (until its result was on the host: the report's kernel share).
Drawing inputs, the reference, the bound and the verdict live in the judge's process,
which this one cannot reach: a kernel that patches the suite here patches nothing that
judges it.

What it also watches, because only here can it be seen: whether the call changed its
inputs (their bits are compared after the call; the changed values go back, for the judge
to apply to its own copies, SDPA-1.6), and whether they change later (at the next
request, or after ``recheck``'s delay: a kernel that zeroes its inputs from a thread after
returning).  Messages to the judge are pickled here and read there as plain data only.
"""

from __future__ import annotations

import gc
import pickle
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from ...backends import Backend
from ...backends.exchange import ArrayPayload, host_view
from ..call.gradients import BackwardCall, kernel_gradients
from ..call.side_effects import kernel_output_to
from ..call.wire import (
    RaisedRemotely,
    export_value,
    float_bits,
    import_value,
    named_arguments,
    receive_message,
    send_message,
)
from ..judge.kernel import KernelUnderTest
from ..judge.kernel_info import KernelInfo
from .worker import (
    keep_freed_memory,
    limit_memory,
    no_huge_page_advice,
    serve_until_orphaned,
    use_worker_threads,
)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` hold the same dtype, shape and bits (NaN payloads and -0.0
    included)."""
    return (
        a.dtype == b.dtype and a.shape == b.shape and np.array_equal(float_bits(a), float_bits(b))
    )


class _Inputs:
    """The arrays of one call with their bits as the kernel got them (or left them), to
    find out whether the kernel changed them (SDPA-1.6).  The bits as it got them are
    those that crossed the wire (the payload stays here, the kernel got a fresh array built
    from it): no copy and no digest of each input before the call, one comparison after."""

    def __init__(self, backend: Backend, named: dict[str, Any], sent: dict[str, Any]) -> None:
        self.backend = backend
        self.arrays = {n: x for n, x in named.items() if backend.is_array(x)}
        self.before = {n: self._as_given(x, sent.get(n)) for n, x in self.arrays.items()}

    def _host(self, x: Any) -> np.ndarray:
        # a NumPy array as it is; another library's as NumPy (a view of its memory where
        # the library shares it, PyTorch's CPU tensors)
        return x if isinstance(x, np.ndarray) else np.asarray(self.backend.to_numpy(x))

    def _as_given(self, x: Any, payload: Any) -> np.ndarray:
        """The bits of ``x`` as the kernel gets it: its payload's values where they are
        those bits in memory of their own (a floating dtype NumPy holds: NumPy, PyTorch and
        JAX copy it), else a copy (a boolean mask NumPy builds on the payload's memory,
        bfloat16 crossed as float32, whose NaNs a library may rewrite)."""
        now = self._host(x)
        if isinstance(payload, ArrayPayload) and payload.values.dtype == now.dtype:
            given = host_view(payload)
            # not the kernel's own memory (NumPy builds a boolean mask on the payload's)
            if not np.may_share_memory(now, given) and _same_bits(now, given):
                return given
        return np.array(now, copy=True)

    def changed(self) -> dict[str, Any]:
        """The arrays whose bits changed since they were given (or last found changed), as
        payloads of their values now; their bits now become the ones compared with."""
        found = {}
        for name, x in self.arrays.items():
            now = self._host(x)
            if not _same_bits(now, self.before[name]):
                found[name] = export_value(self.backend, x)
                self.before[name] = np.array(now, copy=True)
        return found


class KernelServer:
    """Calls the loaded kernel as the judge asks (see the module doc)."""

    def __init__(self, connection: Connection, kernel: KernelUnderTest) -> None:
        self.connection, self.kernel, self.backend = connection, kernel, kernel.backend
        self.held: dict[str, Any] = {}  # the kernel's callables, by the names the judge holds
        self.last: _Inputs | None = None
        self.last_description = ""

    def info(self, note: str) -> tuple[KernelInfo, dict[str, Any]]:
        info = KernelInfo.of(self.kernel, self.kernel.loader, note, self.held)
        fn = self.kernel.raw_fn
        extras = {
            "name": getattr(fn, "__name__", "kernel"),
            "qualname": getattr(fn, "__qualname__", "kernel"),
            "module": getattr(fn, "__module__", None) or "",
            "libraries_used": tuple(sorted(_libraries_used(fn))),
        }
        return info, extras

    def serve(self) -> None:
        while True:
            request = receive_message(self.connection)
            if request is None:
                return
            kind = request[0]
            if kind == "call":
                send_message(self.connection, self.call(*request[1:]))
            elif kind == "vjp":  # ("vjp", args, kwargs, description, dO, bias keyword, dlse,
                # the keywords differentiated, d final state, with output): BackwardCall's
                args, kwargs, description = request[1:4]
                upstream = tuple(request[4:10])
                answer = self.call("kernel", args, kwargs, description, upstream)
                send_message(self.connection, answer)
            elif kind == "recheck":
                time.sleep(request[1])
                send_message(self.connection, ("rechecked", self._late_changes()))
            else:
                send_message(self.connection, ("unknown-request", repr(kind)[:100]))

    def _late_changes(self) -> tuple[str, dict[str, Any]] | None:
        if self.last is None:
            return None
        changed = self.last.changed()
        return (self.last_description, changed) if changed else None

    def call(
        self,
        target: str,
        args: Any,
        kwargs: Any,
        description: str,
        upstream: tuple[Any, ...] | None = None,
    ) -> tuple[Any, ...]:
        """One call: ``target`` is "kernel" or the name of a held callable; with
        ``upstream`` (dO, the bias keyword or None, dlse or None), the kernel's gradients for dO
        instead of its output (:func:`~..call.gradients.kernel_gradients`, spec/backward.md)."""
        late = self._late_changes()
        fn = self.kernel.raw_fn if target == "kernel" else self.held.get(target)
        if fn is None:
            return (
                "raised",
                RaisedRemotely("builtins", "LookupError", f"no callable {target!r}"),
                0.0,
                late,
            )
        sent = named_arguments(tuple(args), kwargs)
        args = import_value(self.backend, args, self.held)
        kwargs = import_value(self.backend, kwargs, self.held)
        inputs = _Inputs(self.backend, named_arguments(tuple(args), kwargs), sent)
        error_state = np.geterr()
        started = time.perf_counter()
        try:
            if upstream is None:
                result = fn(*args, **kwargs)
            else:
                grad_out, bias_keyword, grad_lse, wrt, grad_state, with_output = upstream
                call = BackwardCall(
                    tuple(args),
                    kwargs,
                    import_value(self.backend, grad_out),
                    bias_keyword,
                    import_value(self.backend, grad_lse),
                    tuple(wrt),
                    import_value(self.backend, grad_state),
                    bool(with_output),
                )
                result = kernel_gradients(self.backend, fn, self.kernel.declaration, call)
            exported = export_value(self.backend, result)
            # until the result is on the host: a library that runs asynchronously (JAX)
            # computes it while it is read
            seconds = time.perf_counter() - started
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, (int, str, type(None))) else repr(exc.code)
            return ("exited", code, time.perf_counter() - started, late)
        except KeyboardInterrupt:
            return ("interrupted", None, time.perf_counter() - started, late)
        except BaseException as exc:
            return ("raised", RaisedRemotely.of(exc), time.perf_counter() - started, late)
        finally:
            np.seterr(**error_state)
        if target == "kernel":
            self.last, self.last_description = inputs, description
        return ("returned", exported, inputs.changed(), seconds, late)


def _libraries_used(fn: Any) -> set[str]:
    from ..judge.exception_hints import array_libraries_used

    return array_libraries_used(fn)


def serve(connection: Connection) -> None:
    """Load the kernel, say it is ready, and serve calls until told to stop."""
    from .kernel_setup import SetupError

    try:
        setup_bytes, memory_limit_gib = connection.recv()
        setup, _ = pickle.loads(setup_bytes) if isinstance(setup_bytes, bytes) else setup_bytes
    except Exception as exc:  # e.g. a callable kernel this process cannot import by name
        send_message(
            connection,
            (
                "setup-error",
                f"the kernel's process could not rebuild the kernel setup "
                f"({type(exc).__name__}: {exc}); check a MODULE:FUNC target, or run "
                "in-process (--no-isolate, isolate=False)",
            ),
        )
        return
    # what crosses the wire is copied here at every call (its bytes, the arrays rebuilt
    # from them): from memory kept for it, not from fresh pages faulted in one by one
    keep_freed_memory()
    no_huge_page_advice()
    try:
        backend = setup.make_backend()
        note = limit_memory(backend, memory_limit_gib)
        try:
            kernel = setup.prepare(backend)
        except KeyboardInterrupt:
            raise SetupError(
                f"loading kernel {setup.kernel!r} raised KeyboardInterrupt "
                "(at import?): nothing was checked"
            ) from None
    except SetupError as exc:
        send_message(connection, ("setup-error", str(exc)))
        return
    use_worker_threads()
    server = KernelServer(connection, kernel)
    info, extras = server.info(note)
    send_message(connection, ("ready", info, extras))
    gc.freeze()
    with kernel_output_to(sys.stdout):
        server.serve()


def main(argv: list[str] | None = None) -> None:
    """``python -c '...kernel_process import main; main()' FD LIFELINE``."""
    serve_until_orphaned(serve, argv)


__all__ = ["KernelServer", "main", "serve"]
