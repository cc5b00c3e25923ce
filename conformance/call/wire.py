"""What crosses between the judge and the kernel's process: a call's arguments, its result,
or what went wrong, as plain data.

The judge never holds an object the kernel made: an array comes back as an
:class:`~attnspec.backends.exchange.ArrayPayload` and is rebuilt as a fresh array; anything
else that is not plain data (another library's array, a lazy object, an array subclass, a
custom object) comes back as a :class:`ForeignValue` that only says what it was; an
exception comes back as a :class:`RaisedRemotely` and is raised again in the judge as an
exception of the same name and message.  Nothing the kernel returns can run code in the
judge's process.
"""

from __future__ import annotations

import builtins
import dataclasses
import io
import os
import pickle
import select
import struct
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import array_api_compat
import numpy as np

from ...backends import Backend
from ...backends.exchange import ArrayPayload, export_array, import_array

PLAIN = (type(None), bool, int, float, complex, str, bytes)


@dataclass(frozen=True)
class ForeignValue:
    """Stands in the judge for a value the kernel returned that is neither plain data nor an
    array of the backend: its type (as ``module.qualname``), whether it is an Array API
    array of another library, and its repr (cut short)."""

    module: str
    qualname: str
    is_array_api_obj: bool
    text: str

    @property
    def type_name(self) -> str:
        return self.qualname if self.module == "builtins" else f"{self.module}.{self.qualname}"

    def __repr__(self) -> str:
        return f"<{self.type_name} from the kernel's process: {self.text}>"


@dataclass(frozen=True)
class CallableInKernelProcess:
    """Stands in the judge for a callable of the kernel's (a declared feature map, an extra
    keyword's value): passed back as an argument, the kernel's process puts the original in
    its place; called in the judge, it raises (the judge never runs the kernel's code)."""

    name: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self.name} runs in the kernel's process, not in the judge's")


def export_value(backend: Backend, value: Any, callables: dict[str, Any] | None = None) -> Any:
    """``value`` as plain data: arrays of ``backend`` as payloads, tuples, lists and dicts
    item by item, plain values as they are, a callable as a :class:`CallableInKernelProcess`
    (recorded in ``callables`` by name when given), anything else as a :class:`ForeignValue`."""
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, np.ndarray) and not backend.is_array(value):
        return np.array(value, copy=True)  # NumPy data, e.g. a feature map's input
    if isinstance(value, (ForeignValue, CallableInKernelProcess, ArrayPayload)):
        return value
    if backend.is_array(value):
        return export_array(backend, value)
    if isinstance(value, (tuple, list)):
        items = [export_value(backend, item, callables) for item in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: export_value(backend, item, callables) for key, item in value.items()}
    if callable(value) and not array_api_compat.is_array_api_obj(value):
        name = getattr(value, "__qualname__", None) or type(value).__qualname__
        if callables is not None:
            callables[name] = value
        return CallableInKernelProcess(name)
    kind = type(value)
    try:
        text = repr(value)[:200]
    except Exception as exc:  # a repr that raises is still an answer: it says what it is
        text = f"(repr raised {type(exc).__name__})"
    return ForeignValue(
        kind.__module__, kind.__qualname__, array_api_compat.is_array_api_obj(value), text
    )


def import_value(backend: Backend, value: Any, callables: dict[str, Any] | None = None) -> Any:
    """The inverse of :func:`export_value`: payloads rebuilt as fresh arrays of ``backend``;
    a :class:`CallableInKernelProcess` replaced by the original from ``callables`` when
    given (in the kernel's process), kept as the stand-in otherwise."""
    if isinstance(value, ArrayPayload):
        return import_array(backend, value)
    if isinstance(value, CallableInKernelProcess) and callables is not None:
        return callables.get(value.name, value)
    if isinstance(value, (tuple, list)):
        items = [import_value(backend, item, callables) for item in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {key: import_value(backend, item, callables) for key, item in value.items()}
    return value


def float_bits(values: np.ndarray) -> np.ndarray:
    """The stored bits of ``values`` as unsigned integers when it is a float array (so
    -0.0 != 0.0 and NaN payloads count), ``values`` itself otherwise."""
    a = np.ascontiguousarray(values)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind == "f" else a


def named_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments by name: the positional ones as q, k, v (then arg3, ...), the
    keywords by their own names, a keyword that repeats a positional name (a KV-cache
    kernel's new ``k=`` beside its positional cache) as ``k=``."""
    positional = ("q", "k", "v")
    named = {
        (positional[i] if i < len(positional) else f"arg{i}"): value for i, value in enumerate(args)
    }
    for name, value in kwargs.items():
        named[f"{name}=" if name in named else name] = value
    return named


@dataclass(frozen=True)
class RaisedRemotely:
    """An exception the kernel raised in its process: its type's name and module, the
    nearest built-in exception type it derives from, and its message."""

    module: str
    qualname: str
    message: str
    builtin_base: str = "Exception"

    @classmethod
    def of(cls, exc: BaseException) -> RaisedRemotely:
        kind = type(exc)
        try:
            message = str(exc)
        except Exception as failed:
            message = f"(str() of the exception raised {type(failed).__name__})"
        base = next(
            (
                t.__name__
                for t in kind.__mro__
                if t.__module__ == "builtins" and issubclass(t, Exception)
            ),
            "Exception",
        )
        return cls(kind.__module__, kind.__qualname__, message[:2000], base)

    def exception(self) -> Exception:
        """An exception of the same name and message, raised again in the judge: a
        built-in type (``ValueError``, ``MemoryError``, ...) as itself; any other as a
        subclass of the built-in type it derives from, with the original's name and
        module, one class per name (so that the same exception raised twice is of the
        same type, as Hypothesis checks when it replays a failure)."""
        if self.module == "builtins":
            builtin = getattr(builtins, self.qualname, None)
            if isinstance(builtin, type) and issubclass(builtin, Exception):
                try:
                    return builtin(self.message)
                except TypeError:  # a built-in whose constructor takes other arguments
                    pass
        return _stand_in_class(self.module, self.qualname, self.builtin_base)(self.message)


_STAND_INS: dict[tuple[str, str, str], type[Exception]] = {}


def _stand_in_class(module: str, qualname: str, base_name: str) -> type[Exception]:
    key = (module, qualname, base_name)
    if key not in _STAND_INS:
        base = getattr(builtins, base_name, Exception)
        if not (isinstance(base, type) and issubclass(base, Exception)):
            base = Exception
        name = qualname.rsplit(".", 1)[-1]
        _STAND_INS[key] = type(name, (base,), {"__module__": module, "__qualname__": qualname})
    return _STAND_INS[key]


# What a message from the kernel's process may be built of.  Its bytes are written by the
# kernel's process, which the kernel controls: an ordinary unpickler would let them run any
# code in the judge, so only these classes (plain data) may appear in them.
_SAFE_GLOBALS = {
    ("builtins", "complex"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
}
_SAFE_MODULE_PREFIXES = ("attnspec.",)
# the declaration's own data classes (KernelDeclaration, the family claims) are plain data
_CLAIM_MODULES = ("attnspec.conformance.claims.",)


# NumPy's own rebuild of an array pickled with its buffer out of band (protocol 5)
_FROMBUFFER = {("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer")}


def _array_from_buffer(buffer: Any, dtype: Any, shape: Any, order: Any = "C") -> np.ndarray:
    """NumPy's ``_frombuffer`` over a buffer that crossed the wire: a received buffer is
    memory of this process's own (:func:`receive_message`), so the array is writable even
    where the sender's was read-only (pickle then hands it over as a read-only view)."""
    if isinstance(buffer, memoryview) and isinstance(buffer.obj, np.ndarray):
        buffer = buffer.obj
    array: np.ndarray = np.frombuffer(buffer, dtype=dtype).reshape(shape, order=order)
    return array


class _Unpickler(pickle.Unpickler):
    """Reads what the judge sends (the kernel's process trusts it), arrays rebuilt over
    the received buffers as arrays of their own (:func:`_array_from_buffer`)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _FROMBUFFER:
            return _array_from_buffer
        return super().find_class(module, name)


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _FROMBUFFER:
            return _array_from_buffer
        allowed = (module, name) in _SAFE_GLOBALS or (
            module == "numpy.dtypes" and name.endswith("DType")
        )
        if module.startswith(_SAFE_MODULE_PREFIXES):
            value = super().find_class(module, name)
            # attnspec's own data classes only (a declaration and its claims, payloads, the
            # kernel's description): never a function or a module of the package
            allowed = isinstance(value, type) and (
                getattr(value, "__attnspec_wire__", False)
                or (module.startswith(_CLAIM_MODULES) and dataclasses.is_dataclass(value))
            )
            if allowed:
                return value
        if not allowed:
            raise pickle.UnpicklingError(
                f"a message from the kernel's process names {module}.{name}, which is not "
                "plain data: refused"
            )
        return super().find_class(module, name)


def loads_from_kernel(data: bytes | memoryview, buffers: list[np.ndarray] | None = None) -> Any:
    """A message the kernel's process sent, read as plain data only (see _SAFE_GLOBALS)."""
    return _PlainDataUnpickler(io.BytesIO(data), buffers=buffers).load()


# -- messages between the judge and the kernel's process -------------------------------------
#
# A message is pickled (protocol 5) with every array's buffer out of band: the pickle and
# the small buffers go as one frame of the connection; each large buffer follows on its
# own, written from the array's memory and read into a fresh array of the receiver's (no
# copy into or out of a pickle, none through an intermediate byte string).  What the judge
# reads is memory of its own, written once: the kernel's process cannot change it after
# it arrived, and the judge keeps its own copies of the inputs it sent.

_HEADER = struct.Struct("<QQ")  # how many buffers, the pickle's length; then their sizes
_SIZE = struct.Struct("<Q")
_INLINE_BYTES = 64 * 1024  # a buffer smaller than this rides in the frame


def send_message(connection: Connection, message: Any) -> None:
    """Send ``message`` (see above) for :func:`receive_message` to read."""
    buffers: list[memoryview] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        buffers.append(buffer.raw())
        return False

    head = pickle.dumps(message, protocol=5, buffer_callback=out_of_band)
    sizes = [view.nbytes for view in buffers]
    frame: list[bytes | memoryview] = [_HEADER.pack(len(sizes), len(head))]
    frame += [*map(_SIZE.pack, sizes), head]
    frame += [view for view in buffers if view.nbytes < _INLINE_BYTES]
    connection.send_bytes(b"".join(frame))
    fd = connection.fileno()
    for view in buffers:
        if view.nbytes >= _INLINE_BYTES:
            _write_all(fd, view)


def receive_message(
    connection: Connection, deadline: float | None = None, *, from_kernel: bool = False
) -> Any:
    """The next message :func:`send_message` sent on ``connection``; from the kernel's
    process (``from_kernel``), read as plain data only.  ``deadline``
    (``time.monotonic()``): TimeoutError when a large buffer has not arrived by then;
    EOFError when the sender went away; pickle.UnpicklingError for what is no message."""
    frame = connection.recv_bytes()
    try:
        count, head_length = _HEADER.unpack_from(frame)
        at = _HEADER.size + count * _SIZE.size
        if at > len(frame):
            raise ValueError(f"{count} buffers announced in a frame of {len(frame)} bytes")
        sizes = [_SIZE.unpack_from(frame, _HEADER.size + i * _SIZE.size)[0] for i in range(count)]
        head = memoryview(frame)[at : at + head_length]
        at += head_length
        buffers = []
        for size in sizes:
            if size < _INLINE_BYTES:
                if at + size > len(frame):
                    raise ValueError("a buffer runs past the end of its frame")
                buffers.append(np.frombuffer(frame, np.uint8, size, at).copy())
                at += size
            else:
                buffers.append(np.empty(size, np.uint8))
                _read_exactly(connection.fileno(), buffers[-1].data, deadline)
        if from_kernel:
            return loads_from_kernel(head, buffers)
        return _Unpickler(io.BytesIO(head), buffers=buffers).load()
    except (EOFError, TimeoutError, OSError, pickle.UnpicklingError):
        raise
    except Exception as exc:  # struct.error, a size NumPy cannot allocate, a bad rebuild
        raise pickle.UnpicklingError(f"{type(exc).__name__}: {exc}") from None


def _write_all(fd: int, view: memoryview) -> None:
    while view.nbytes:
        view = view[os.write(fd, view) :]


def _read_exactly(fd: int, view: memoryview, deadline: float | None) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while view.nbytes:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not poller.poll(wait * 1000):
                raise TimeoutError("a message's buffer did not arrive in time")
        got = os.readv(fd, [view])
        if got == 0:
            raise EOFError("the connection closed in the middle of a message")
        view = view[got:]


def wire_type(cls: type[Any]) -> type[Any]:
    """Mark ``cls`` as a data class a message from the kernel's process may hold."""
    cls.__attnspec_wire__ = True
    return cls


for _cls in (ArrayPayload, ForeignValue, CallableInKernelProcess, RaisedRemotely):
    wire_type(_cls)
