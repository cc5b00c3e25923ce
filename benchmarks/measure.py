"""Timing, peak memory and a GEMM peak, the same way for every library.

The calls compared at one size are timed together: each is run once untimed (JAX
compiles there; that time is kept as ``first_seconds``), then in rounds, every call once
per round, so that all of them meet the same interference from the machine's other work;
the fastest run of each is reported.  There are as many rounds as ``budget_seconds``
allows after the first (at least one, at most ``repeats``; none for ``repeats=0``, whose
time is the first run's).  Peak memory is that of the
single call that used most, first runs included (allocators that keep buffers, as XLA's
does, would hide it otherwise), above the memory in use before it.
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


@dataclass
class Timing:
    seconds: float
    first_seconds: float
    runs: int
    peak_bytes: int | None


def _run_once(call: Callable[[], Any], probe: MemoryProbe) -> tuple[float, int | None]:
    probe.start()
    started = time.perf_counter()
    synchronize(call())
    return time.perf_counter() - started, probe.peak()


def _larger(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def time_together(
    calls: dict[str, Callable[[], Any]], probe: MemoryProbe, *, repeats: int, budget_seconds: float
) -> dict[str, Timing]:
    """Each call's :class:`Timing`, measured as the module docstring says."""
    first = {name: _run_once(call, probe) for name, call in calls.items()}
    round_seconds = sum(t for t, _ in first.values())
    rounds = max(1, min(repeats, int(budget_seconds / round_seconds) if round_seconds else 1))
    rounds = 0 if repeats == 0 else rounds  # the first runs only (minutes each)
    times: dict[str, list[float]] = {name: [] for name in calls}
    peaks = {name: peak for name, (_, peak) in first.items()}
    for _ in range(rounds):
        for name, call in calls.items():
            seconds, peak = _run_once(call, probe)
            times[name].append(seconds)
            peaks[name] = _larger(peaks[name], peak)
    return {
        name: Timing(min(times[name], default=first[name][0]), first[name][0], rounds, peaks[name])
        for name in calls
    }


def fits(backend: Backend, planned_bytes: float) -> str | None:
    """None when ``planned_bytes`` fit in the free memory with headroom, else the reason."""
    free = memory_available(backend)
    if free is None or planned_bytes <= MEMORY_HEADROOM * free:
        return None
    return (
        f"needs about {planned_bytes / 1e9:.1f} GB; {free / 1e9:.1f} GB free, of which "
        f"{MEMORY_HEADROOM:.0%} may be planned"
    )


def gemm_gflops(backend: Backend, dtype: str, size: int, *, repeats: int) -> float:
    """GFLOP/s of one ``size x size`` matrix product through the backend's namespace."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = (backend.asarray(rng.standard_normal((size, size)), dtype=dtype) for _ in range(2))
    timing = time_together(
        {"gemm": lambda: backend.xp.matmul(a, b)},
        MemoryProbe(backend),
        repeats=repeats,
        budget_seconds=2.0,
    )["gemm"]
    return 2 * size**3 / timing.seconds / 1e9


def attention_flops(
    batch_heads: int, n_queries: int, n_keys: int, head_dim: int, value_dim: int, causal: bool
) -> float:
    """Multiply-adds x 2 of q k^T and p v over the pairs a query may attend (top-left
    causal: key j <= query i), the count FlashAttention's benchmarks use."""
    if not causal:
        pairs = n_queries * n_keys
    elif n_queries <= n_keys:  # query i attends min(i + 1, Lk) keys
        pairs = n_queries * (n_queries + 1) // 2
    else:
        pairs = n_keys * (n_keys + 1) // 2 + (n_queries - n_keys) * n_keys
    return 2.0 * batch_heads * pairs * (head_dim + value_dim)


# An exponent from fewer lengths, or from lengths closer together, says more about the
# machine's noise than about the algorithm (issue 33: --quick printed one from 3 lengths).
MIN_EXPONENT_LENGTHS, MIN_EXPONENT_SPAN = 4, 8


def power_law_exponent(lengths: list[int], seconds: list[float]) -> float | None:
    """Least-squares slope of log(seconds) against log(length): time ~ length**slope; None
    unless there are :data:`MIN_EXPONENT_LENGTHS` distinct lengths with a time, the longest
    at least :data:`MIN_EXPONENT_SPAN` times the shortest."""
    timed = [(n, t) for n, t in zip(lengths, seconds, strict=True) if t and t > 0]
    distinct = sorted({n for n, _ in timed})
    if len(distinct) < MIN_EXPONENT_LENGTHS or distinct[-1] < MIN_EXPONENT_SPAN * distinct[0]:
        return None
    points = [(math.log(n), math.log(t)) for n, t in timed]
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
