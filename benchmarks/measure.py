"""Timing, peak memory and a GEMM peak, the same way for every library.

A call is run once untimed (JAX compiles there; its time is kept as ``first_seconds``),
then timed until ``repeats`` runs or ``min_seconds`` of runs, whichever ends first; the
fastest run is reported, because on a shared machine every slowdown is interference.
Peak memory covers the first and the timed runs (allocators that keep buffers, as XLA's
does, would hide the timed runs' use) and counts only what they add to what was in use.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..backends import Backend
from .frameworks import MemoryProbe, memory_available, synchronize

# Fraction of the free memory a measurement may plan to use; the rest is left to the
# machine's other work, so an estimate that is off does not end the run.
MEMORY_HEADROOM = 0.5


@dataclass
class Measurement:
    """One timed call; ``skipped`` gives the reason when it was not run."""

    section: str
    backend: str
    impl: str
    length: int
    seconds: float | None = None
    first_seconds: float | None = None
    runs: int = 0
    peak_bytes: int | None = None
    skipped: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def timed(call: Callable[[], Any], probe: MemoryProbe, *, repeats: int,
          min_seconds: float) -> tuple[float, float, int, int | None]:
    """``(fastest, first, runs, peak bytes)`` of ``call`` as the module docstring says."""
    probe.start()
    started = time.perf_counter()
    synchronize(call())
    first = time.perf_counter() - started
    times: list[float] = []
    while not times or (len(times) < repeats and sum(times) < min_seconds):
        started = time.perf_counter()
        synchronize(call())
        times.append(time.perf_counter() - started)
    return min(times), first, len(times), probe.peak()


def fits(backend: Backend, planned_bytes: float) -> str | None:
    """None when ``planned_bytes`` fit in the free memory with headroom, else the reason."""
    free = memory_available(backend)
    if free is None or planned_bytes <= MEMORY_HEADROOM * free:
        return None
    return (f"needs about {planned_bytes / 1e9:.1f} GB; {free / 1e9:.1f} GB free, of which "
            f"{MEMORY_HEADROOM:.0%} may be planned")


def gemm_gflops(backend: Backend, dtype: str, size: int, *, repeats: int,
                min_seconds: float) -> float:
    """GFLOP/s of one ``size x size`` matrix product through the backend's namespace."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = (backend.asarray(rng.standard_normal((size, size)), dtype=dtype) for _ in range(2))
    seconds, *_ = timed(lambda: backend.xp.matmul(a, b), MemoryProbe(backend),
                        repeats=repeats, min_seconds=min_seconds)
    return 2 * size**3 / seconds / 1e9


def attention_flops(batch_heads: int, n_queries: int, n_keys: int, head_dim: int,
                    value_dim: int, causal: bool) -> float:
    """Multiply-adds x 2 of q k^T and p v over the pairs a query may attend (top-left
    causal: key j <= query i), the count FlashAttention's benchmarks use."""
    if not causal:
        pairs = n_queries * n_keys
    elif n_queries <= n_keys:  # query i attends min(i + 1, Lk) keys
        pairs = n_queries * (n_queries + 1) // 2
    else:
        pairs = n_keys * (n_keys + 1) // 2 + (n_queries - n_keys) * n_keys
    return 2.0 * batch_heads * pairs * (head_dim + value_dim)


def power_law_exponent(lengths: list[int], seconds: list[float]) -> float | None:
    """Least-squares slope of log(seconds) against log(length): time ~ length**slope."""
    points = [(math.log(n), math.log(t)) for n, t in zip(lengths, seconds, strict=True)
              if t and t > 0]
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
