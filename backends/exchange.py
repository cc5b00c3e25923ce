"""Arrays moved between processes as they are: values, dtype, and memory layout.

The conformance suite judges a kernel in one process and runs it in another
(``conformance/run/kernel_process.py``).  An argument crosses as an :class:`ArrayPayload`
and is rebuilt there as an array of the same library, device, dtype and values, and, where
the library has strides (NumPy, PyTorch, CuPy), the same layout: a strided, transposed or
stride-0 broadcast view stays such a view over a buffer holding the same memory, filler
included (what a kernel that ignores strides would read).  A result crosses back the same
way.  This module holds the library-specific part: how to read and rebuild a view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from . import Backend


@dataclass(frozen=True)
class ArrayPayload:
    """One array in transit.  ``values``: NumPy values (bfloat16 widened exactly to
    float32); with ``strides`` (in elements), the 1-D memory the array views from its first
    element on, which ``shape`` and ``strides`` index; otherwise the array itself."""

    values: np.ndarray  # a float8 array's stored bits (uint8): NumPy has no float8
    dtype: str  # the library's dtype by name: "float16", "bfloat16", "float8_e4m3fn", ...
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes)


def export_array(backend: Backend, x: Any) -> ArrayPayload:
    """``x`` (an array of ``backend``) as a payload that :func:`import_array` rebuilds."""
    shape = tuple(int(n) for n in x.shape)
    layout = _layout_of(backend.name, x)
    memory, strides = layout if layout is not None else (x, None)
    float8 = backend.float8_name(x)
    host = backend.float8_bits(memory) if float8 else backend.to_numpy(memory)
    values = np.ascontiguousarray(host)
    name = float8 or backend.dtype_name(x) or str(values.dtype)
    return ArrayPayload(values, name, shape, strides)


def import_array(backend: Backend, payload: ArrayPayload) -> Any:
    """The array ``payload`` describes, on ``backend`` (its device, dtype and layout)."""
    if payload.dtype in backend.float8_names:
        memory = backend.from_float8_bits(payload.values, payload.dtype)
    else:
        floating = payload.dtype in backend.dtype_names
        memory = backend.asarray(payload.values, payload.dtype if floating else None)
    if payload.strides is None:
        return memory
    return _view(backend.name, memory, payload.shape, payload.strides)


def host_view(payload: ArrayPayload) -> np.ndarray:
    """The NumPy values ``payload`` carries, in the shape (and, for a view, the layout) of
    the array it describes: a view of ``payload.values``, no copy."""
    if payload.strides is None:
        return payload.values
    itemsize = payload.values.itemsize
    return np.lib.stride_tricks.as_strided(
        payload.values,
        shape=payload.shape,
        strides=tuple(s * itemsize for s in payload.strides),
        writeable=False,
    )


def _span(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Elements from a view's first element to its last, inclusive."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))


def _layout_of(library: str, x: Any) -> tuple[Any, tuple[int, ...]] | None:
    """(the 1-D memory ``x`` views, its strides in elements) for a view with a layout of
    its own; None for a contiguous array, an empty one, a library without strides, and a
    negative stride (sent as a contiguous copy: no suite input has one)."""
    if library in ("numpy", "cupy"):
        if x.flags.c_contiguous or x.size == 0:
            return None
        strides = tuple(s // x.itemsize for s in x.strides)
        if any(s < 0 or s * x.itemsize != b for s, b in zip(strides, x.strides, strict=True)):
            return None
        module = np if library == "numpy" else _cupy()
        memory = module.lib.stride_tricks.as_strided(
            x, shape=(_span(x.shape, strides),), strides=(x.itemsize,)
        )
        return memory.copy(), strides
    if library == "torch":
        if x.is_contiguous() or x.numel() == 0:
            return None
        import torch

        strides = tuple(int(s) for s in x.stride())
        memory = torch.as_strided(x, (_span(tuple(x.shape), strides),), (1,))
        return memory.clone(), strides
    return None


def _view(library: str, memory: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    if library in ("numpy", "cupy"):
        module = np if library == "numpy" else _cupy()
        itemsize = memory.itemsize
        return module.lib.stride_tricks.as_strided(
            memory, shape=shape, strides=tuple(s * itemsize for s in strides)
        )
    if library == "torch":
        import torch

        return torch.as_strided(memory, shape, strides)
    raise ValueError(f"library={library!r} has no strides to rebuild a view with")


def _cupy() -> Any:
    import cupy

    return cupy
