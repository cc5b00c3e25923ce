"""Backend selection: which array library (and device) attnspec creates arrays with.

``ATTNSPEC_BACKEND`` and ``ATTNSPEC_DEVICE`` pick the default when ``attnspec`` is
imported; :func:`set_backend` and the :func:`use_backend` context manager change it in
code.  Functions that take arrays never consult this: they follow their inputs.

May import: nothing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

from ._registry import (
    ADAPTERS,
    FLOAT8_DTYPE_NAMES,
    FLOAT_DTYPE_NAMES,
    SHAPE_POOLS_VARIABLE,
    BackendError,
    canonical_name,
    env_choice,
    shape_pools_asked,
)

__all__ = [
    "BACKEND_NAMES",
    "FLOAT8_DTYPE_NAMES",
    "FLOAT_DTYPE_NAMES",
    "REFERENCE_CONFIG",
    "SHAPE_POOLS_VARIABLE",
    "Backend",
    "BackendError",
    "available_backends",
    "get_backend",
    "set_backend",
    "use_backend",
]

BACKEND_NAMES: tuple[str, ...] = tuple(ADAPTERS)


# The library settings attnspec's own tests and survey evaluate the reference in: JAX
# with float64 available and true float32 matmuls (SDPA-7.2).  Kernels are checked in the
# settings their users run unless a check asks otherwise (--jax-x64).
REFERENCE_CONFIG: dict[str, dict[str, Any]] = {
    "jax": {"jax_enable_x64": True, "jax_default_matmul_precision": "highest"},
}


class Backend:
    """An array library on one device, with the conversions the test suites need.

    ``config`` changes library-wide settings (only JAX has any: ``jax_enable_x64``,
    ``jax_default_matmul_precision``); :attr:`changes` lists what it changed and
    :attr:`settings` describes the settings in force.  Without ``config`` nothing is
    changed.
    """

    def __init__(
        self, name: str, device: Any = None, *, config: Mapping[str, Any] | None = None
    ) -> None:
        self.name = canonical_name(name)
        self._adapter = ADAPTERS[self.name]
        self.xp: ModuleType = self._adapter.load()
        self.changes: list[str] = self._adapter.configure(self.xp, dict(config or {}))
        if device is None:
            self.device = self._adapter.default_device(self.xp)
        elif isinstance(device, str):
            self.device = self._adapter.parse_device(self.xp, device)
        else:
            self.device = device

    def __repr__(self) -> str:
        return f"Backend({self.name!r}, device={self.device!r})"

    @property
    def settings(self) -> str:
        """The library-wide settings in force that matter to a check ("" when none)."""
        return self._adapter.describe(self.xp)

    @property
    def compiles_per_shape(self) -> bool:
        """Whether the library compiles a function anew for every new combination of input
        shapes (JAX): a check then reuses a few shapes per run (conformance/shape_pool.py).
        ``ATTNSPEC_SHAPE_POOLS=1`` says so of a kernel that compiles itself per shape on a
        library that does not (``torch.compile``)."""
        return self._adapter.compiles_per_shape or shape_pools_asked()

    @property
    def has_strides(self) -> bool:
        """Whether the library's arrays can be strided, transposed or stride-0 views of
        memory (NumPy, PyTorch, CuPy); a jax.Array cannot (every view is a copy)."""
        return self._adapter.has_strides

    @property
    def on_cpu(self) -> bool:
        """Whether the device is the host's CPU, not an accelerator (a check then runs its
        properties in one worker process per CPU by default: ``attnspec check --jobs``)."""
        return self._adapter.on_cpu(self.device)

    @property
    def dtype_names(self) -> tuple[str, ...]:
        """The spec's floating dtypes (SDPA-7.1) this library supports on this device."""
        return self._adapter.dtype_names(self.xp, self.device)

    @property
    def float8_names(self) -> tuple[str, ...]:
        """The float8 storage dtypes (QUANT-1: ``float8_e4m3fn``, ``float8_e5m2``) this
        library has; () where it has none (NumPy, JAX's Array API namespace)."""
        return self._adapter.float8_names(self.xp)

    def float8_name(self, x: Any) -> str | None:
        """The float8 dtype name of the backend array ``x`` (None: not a float8 array)."""
        dtype = getattr(x, "dtype", None)
        return next((name for name in self.float8_names if self.dtype(name) == dtype), None)

    def float8_bits(self, x: Any) -> Any:
        """The stored bits of the float8 array ``x`` as a NumPy uint8 array of its shape."""
        if self._adapter.float8_bits is None or self.float8_name(x) is None:
            raise ValueError(f"x.dtype={getattr(x, 'dtype', None)}, but should be a float8 dtype")
        return self._adapter.float8_bits(x)

    def from_float8_bits(self, bits: Any, name: str) -> Any:
        """The float8 array of dtype ``name`` whose stored bits are the NumPy uint8 array
        ``bits``, on this backend's device: bit for bit, NaN payloads and -0 included."""
        if name not in self.float8_names or self._adapter.from_float8_bits is None:
            raise ValueError(
                f"dtype={name!r}, but backend {self.name!r} has only the float8 dtypes "
                f"{self.float8_names}"
            )
        return self._adapter.from_float8_bits(self.xp, bits, name, self.device)

    def dtype(self, name: str) -> Any:
        """The library's dtype object for a spec dtype name such as ``"bfloat16"`` (or a
        float8 storage dtype it has, QUANT-1)."""
        if name in self.float8_names:
            return getattr(self.xp, name)
        if name not in FLOAT_DTYPE_NAMES:
            raise ValueError(f"dtype={name!r}, but should be one of {FLOAT_DTYPE_NAMES}")
        if name not in self.dtype_names:
            why = self.missing_dtype_reason(name)
            raise ValueError(
                f"backend {self.name!r} does not support dtype {name!r}"
                + (f": {why}" if why else "")
            )
        return getattr(self.xp, name)

    def is_array(self, x: Any) -> bool:
        """True for an array of this library (a kernel on it must return one, SDPA-1.3)."""
        return self._adapter.is_array(x)

    def missing_dtype_reason(self, name: str) -> str:
        """Why this backend lacks the spec dtype ``name`` now ("" if it has it or cannot say),
        e.g. JAX's float64 while jax_enable_x64 is off."""
        if name in self.dtype_names:
            return ""
        return self._adapter.missing_dtype(self.xp, name)

    def asarray(self, a: Any, dtype: str | None = None) -> Any:
        """Move a NumPy array (or nested list) onto this backend's device.

        ``dtype`` is a spec dtype name; bfloat16 goes through float32 because NumPy has
        no bfloat16 of its own.  Where the library's dtype is one NumPy knows (JAX's
        bfloat16 is ml_dtypes'), the rounding happens on the host: a conversion on the
        device would be one more compilation per shape for a library that compiles (JAX).
        """
        import numpy as np

        a = np.asarray(a)
        if dtype is None:
            return self._adapter.from_numpy(self.xp, a, self.device)
        staging, host = self._staged(a, dtype), self._host_dtype(dtype)
        if host is None:  # PyTorch's and array-api-strict's dtypes: convert on the device
            # staging is fresh: moved without another copy where the library can keep it,
            # and not copied again when it has the dtype already (issue 33)
            moved = (self._adapter.from_fresh_numpy or self._adapter.from_numpy)(
                self.xp, staging, self.device
            )
            return self.xp.astype(moved, self.dtype(dtype), copy=False)
        # staging is a fresh array already (the kernel must not get the caller's)
        return self._adapter.from_numpy(self.xp, staging.astype(host, copy=False), self.device)

    def rounded_on_host(self, a: Any, dtype: str) -> Any:
        """``a`` rounded to ``dtype`` as :meth:`asarray` rounds it, as float64 NumPy values,
        where asarray rounds on the host (a dtype NumPy knows: NumPy's, JAX's, CuPy's);
        None where the library converts on its device."""
        import numpy as np

        host = self._host_dtype(dtype)
        if host is None:
            return None
        staging = self._staged(np.asarray(a), dtype)  # a fresh array
        return staging.astype(host, copy=False).astype(np.float64, copy=False)

    def _host_dtype(self, dtype: str) -> Any:
        """The NumPy dtype of this library's ``dtype``, None where NumPy knows none."""
        import numpy as np

        try:
            return np.dtype(self.dtype(dtype))
        except TypeError:
            return None

    @staticmethod
    def _staged(a: Any, dtype: str) -> Any:
        """``a`` as asarray first converts it on the host: bfloat16 through float32, since
        NumPy has none of its own."""
        import numpy as np

        return a.astype(np.float32) if dtype == "bfloat16" else a.astype(dtype)

    def to_numpy(self, x: Any) -> Any:
        """A NumPy copy of a backend array (bfloat16 widened to float32)."""
        return self._adapter.to_numpy(x)

    @property
    def differentiates(self) -> bool:
        """Whether the library has automatic differentiation (:meth:`vjp`)."""
        return self._adapter.vjp is not None

    @property
    def has_vjp(self) -> bool:
        """Whether the library has automatic differentiation (:meth:`vjp`)."""
        return self._adapter.vjp is not None

    def vjp(
        self, fn: Any, primals: tuple[Any, ...], cotangents: tuple[Any, ...]
    ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """The vector-Jacobian product of ``fn`` at ``primals`` by the library's own
        automatic differentiation (``torch.autograd``, ``jax.vjp``; spec/backward.md,
        BWD-1): ``fn``'s results (a tuple, one per cotangent) and the gradient of each
        primal, as arrays of this library.  BackendError where the library has none."""
        if self._adapter.vjp is None:
            raise BackendError(
                f"backend {self.name!r} has no automatic differentiation; gradients are "
                "computed on torch or jax"
            )
        return self._adapter.vjp(fn, tuple(primals), tuple(cotangents))

    def dtype_name(self, x: Any) -> str | None:
        """The spec dtype name of the backend array ``x`` (None: not a floating dtype this
        backend has)."""
        dtype = getattr(x, "dtype", None)
        return next((name for name in self.dtype_names if self.dtype(name) == dtype), None)

    def on_host(self, x: Any, fn: Any) -> Any:
        """``fn`` applied to a NumPy copy of the floating backend array ``x`` (bfloat16
        widened exactly to float32), its result moved back in ``x``'s dtype: the same values
        as ``fn`` done with the library's own operations when ``fn`` is exact in that dtype
        (zero padding, slicing, a power-of-two factor short of overflow), but with no
        device operation, which a library that compiles per shape (JAX) compiles anew for
        every shape."""
        name = self.dtype_name(x)
        if name is None:
            raise ValueError(
                f"x.dtype={getattr(x, 'dtype', None)}, but should be one of {self.dtype_names}"
            )
        return self.asarray(fn(self.to_numpy(x)), name)


_lock = threading.Lock()
_current: list[Backend | None] = [None]
_requested: list[tuple[str, str | None]] = [("numpy", None)]


def set_backend(name: str, device: Any = None) -> Backend:
    """Make ``name`` (on ``device``) the default backend and return it.

    Raises :class:`BackendError` when the library or device is unusable here and
    ``ValueError`` for an unknown name.
    """
    backend = Backend(name, device)
    with _lock:
        _current[0] = backend
        _requested[0] = (backend.name, device)
    return backend


def get_backend() -> Backend:
    """The default backend (loaded on first use; NumPy unless configured otherwise)."""
    with _lock:
        backend = _current[0]
        if backend is None:
            name, device = _requested[0]
            backend = _current[0] = Backend(name, device)
        return backend


@contextlib.contextmanager
def use_backend(name: str, device: Any = None) -> Iterator[Backend]:
    """Temporarily make ``name`` the default backend inside a ``with`` block."""
    with _lock:
        previous = (_current[0], _requested[0])
    backend = set_backend(name, device)
    try:
        yield backend
    finally:
        with _lock:
            _current[0], _requested[0] = previous


def available_backends() -> dict[str, str]:
    """Each backend name mapped to ``"ok"`` or the reason it cannot be used here."""
    status: dict[str, str] = {}
    for name in ADAPTERS:
        try:
            Backend(name)
        except BackendError as exc:
            status[name] = str(exc)
        else:
            status[name] = "ok"
    return status


def _configure_from_environment() -> None:
    name, device = env_choice()
    if name is None and device is None:
        return
    try:
        set_backend(name or "numpy", device)
    except (ValueError, BackendError) as exc:
        # Raised at `import attnspec`: say that the environment asked for it.
        raise type(exc)(f"ATTNSPEC_BACKEND={name!r}, ATTNSPEC_DEVICE={device!r}: {exc}") from None


_configure_from_environment()
