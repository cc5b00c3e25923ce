"""What the benchmark needs to know about each array library, and nothing else.

Each library's own attention kernel (the one the reference is measured against), how to
wait for a result (JAX and CUDA return before the work is done), how to read the peak
memory of one call on the device it runs on, and how much memory that device has free.
Libraries are imported only when their backend is benchmarked.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from ..backends import Backend


class Framework(NamedTuple):
    """An attention kernel to measure the reference against: ``prepare(q, k, v, mask)``
    (untimed: conversion, layout changes, jit) returns the arguments ``call`` is timed on."""

    name: str
    prepare: Callable[[Any, Any, Any, Any], tuple[Any, ...]]
    call: Callable[..., Any]
    # bytes of memory per score (B x H x Lq x Lk) it holds at once; 0 for O(L) kernels
    bytes_per_score: float


TORCH_SDPA = "torch.nn.functional.scaled_dot_product_attention"


def _to_torch(backend: Backend, a: Any) -> Any:
    """``a`` as a CPU torch tensor: the same memory for NumPy, a copy for JAX."""
    import numpy as np
    import torch

    if a is None or backend.name == "torch":
        return a
    return torch.from_numpy(a if backend.name == "numpy" else np.array(a))


def torch_sdpa(backend: Backend, causal: bool, gqa: bool) -> Framework | None:
    """PyTorch SDPA, the yardstick of every backend: on the backend's own tensors (torch),
    on the same memory (NumPy) or on a copy made before the timing (JAX); None without
    torch or on a device it cannot read.  CPU and CUDA torch pick a flash or
    memory-efficient kernel here: O(L) memory."""
    try:
        import torch
    except ImportError:
        return None
    if backend.name != "torch" and not (backend.name in ("numpy", "jax") and on_cpu(backend)):
        return None

    def prepare(q: Any, k: Any, v: Any, mask: Any) -> tuple[Any, ...]:
        return tuple(_to_torch(backend, a) for a in (q, k, v, mask))

    def call(q: Any, k: Any, v: Any, mask: Any) -> Any:
        options = {"enable_gqa": True} if gqa else {}
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, **options
        )

    where = {"numpy": " (torch.from_numpy)", "jax": " (on a torch copy)"}.get(backend.name, "")
    return Framework(TORCH_SDPA + where, prepare, call, 0.0)


def library_kernel(backend: Backend, causal: bool) -> Framework | None:
    """The backend's own attention kernel besides torch's: ``jax.nn.dot_product_attention``
    under ``jax.jit`` for JAX; None for the others (NumPy has none; torch's is the
    yardstick)."""
    if backend.name != "jax":
        return None
    import jax

    def to_blhd(q: Any, k: Any, v: Any, mask: Any) -> tuple[Any, ...]:
        # jax.nn.dot_product_attention takes (batch, length, heads, dim); the mask stays
        # (batch, heads, Lq, Lk), and fewer key/value heads than query heads is its GQA
        return (*(jax.numpy.swapaxes(a, -2, -3) for a in (q, k, v)), mask)

    attention = jax.jit(
        lambda q, k, v, mask: jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=causal)
    )
    # the XLA implementation forms the float32 logits and the probabilities
    return Framework("jax.nn.dot_product_attention (jax.jit)", to_blhd, attention, 12.0)


def synchronize(result: Any) -> None:
    """Wait until ``result`` is computed (JAX dispatches asynchronously, CUDA too)."""
    if hasattr(result, "block_until_ready"):
        result.block_until_ready()
    elif type(result).__module__.startswith("torch") and result.is_cuda:
        import torch

        torch.cuda.synchronize(result.device)
    elif type(result).__module__.startswith("cupy"):
        import cupy

        cupy.cuda.get_current_stream().synchronize()


def on_cpu(backend: Backend) -> bool:
    device = backend.device
    if backend.name in ("numpy", "array_api_strict"):
        return True
    if backend.name == "torch":
        return bool(device.type == "cpu")
    if backend.name == "jax":
        return bool(device.platform == "cpu")
    return False


def library_version(backend: Backend) -> str:
    module = {"array_api_strict": "array_api_strict"}.get(backend.name, backend.name)
    import importlib

    return str(getattr(importlib.import_module(module), "__version__", "unknown"))


def threads(backend: Backend) -> int | None:
    """Intra-op threads where the library says (torch); None where it does not."""
    if backend.name == "torch":
        import torch

        return int(torch.get_num_threads())
    return None


def set_threads(n: int) -> None:
    """torch's intra-op threads; other libraries read OMP_NUM_THREADS at start-up only."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(n)


def _proc_status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


def _release_free_heap() -> None:
    """Hand memory that malloc keeps after free() back to the system, so that a call reusing
    it shows in the RSS peak as new memory does (glibc's malloc_trim; a no-op elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class MemoryProbe:
    """Peak memory of the calls made between ``start()`` and ``peak()``, above what was in
    use at ``start()``.  ``method`` says how, or why nothing is measured."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.method: str | None = None
        self._baseline = 0
        if on_cpu(backend):
            try:
                Path("/proc/self/clear_refs").write_text("5")
                _proc_status("VmHWM")
                self.method = (
                    "process peak RSS above the RSS at the start (VmHWM, reset "
                    "through /proc/self/clear_refs, after malloc_trim)"
                )
                if backend.name == "jax":
                    # XLA's CPU client reuses buffers it freed without returning them
                    self.method += "; a lower bound for jax, whose allocator keeps buffers"
            except OSError:
                self.method = None
        elif backend.name == "torch":
            self.method = "torch.cuda.max_memory_allocated"

    def start(self) -> None:
        if self.method is None:
            return
        if on_cpu(self.backend):
            _release_free_heap()
            Path("/proc/self/clear_refs").write_text("5")
            self._baseline = _proc_status("VmRSS")
        else:
            import torch

            torch.cuda.synchronize(self.backend.device)
            torch.cuda.reset_peak_memory_stats(self.backend.device)
            self._baseline = torch.cuda.memory_allocated(self.backend.device)

    def peak(self) -> int | None:
        if self.method is None:
            return None
        if on_cpu(self.backend):
            return max(0, _proc_status("VmHWM") - self._baseline)
        import torch

        return max(0, int(torch.cuda.max_memory_allocated(self.backend.device)) - self._baseline)


def memory_available(backend: Backend) -> int | None:
    """Bytes free on the backend's device now (None where the library does not say)."""
    if on_cpu(backend):
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None
    if backend.name == "torch":
        import torch

        return int(torch.cuda.mem_get_info(backend.device)[0])
    if backend.name == "cupy":
        import cupy

        return int(cupy.cuda.runtime.memGetInfo()[0])
    stats = backend.device.memory_stats() if backend.name == "jax" else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    return None
