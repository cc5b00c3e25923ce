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
    """A library's attention kernel: ``prepare(q, k, v)`` (untimed: layout changes, jit)
    returns the arguments that ``call`` is timed on."""

    name: str
    prepare: Callable[[Any, Any, Any], tuple[Any, ...]]
    call: Callable[..., Any]
    # bytes of memory per score (B x H x Lq x Lk) it holds at once; 0 for O(L) kernels
    bytes_per_score: float


def _torch_sdpa(causal: bool) -> Callable[..., Any]:
    import torch

    def torch_sdpa(q: Any, k: Any, v: Any) -> Any:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return torch_sdpa


def framework_kernel(backend: Backend, causal: bool) -> Framework | None:
    """torch SDPA or ``jax.nn.dot_product_attention`` (jitted); for NumPy, which has no
    attention kernel, torch SDPA on the same memory (so that it is timed in the same rounds
    as the NumPy reference); None when none is installed."""
    # CPU and CUDA torch pick a flash or memory-efficient kernel here: O(L) memory
    name = "torch.nn.functional.scaled_dot_product_attention"
    if backend.name == "torch":
        return Framework(name, lambda q, k, v: (q, k, v), _torch_sdpa(causal), 0.0)
    if backend.name == "numpy":
        try:
            import torch
        except ImportError:
            return None
        return Framework(
            f"{name} (torch.from_numpy)",
            lambda q, k, v: tuple(torch.from_numpy(a) for a in (q, k, v)),
            _torch_sdpa(causal),
            0.0,
        )
    if backend.name == "jax":
        import jax

        def to_blhd(q: Any, k: Any, v: Any) -> tuple[Any, ...]:
            # jax.nn.dot_product_attention takes (batch, length, heads, dim)
            return tuple(jax.numpy.swapaxes(a, -2, -3) for a in (q, k, v))

        attention = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal))
        # the XLA implementation forms the float32 logits and the probabilities
        return Framework("jax.nn.dot_product_attention (jax.jit)", to_blhd, attention, 12.0)
    return None


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
