"""The JSON document of a benchmark run: measurements, derived ratios and the targets.

Schema ``attnspec-bench/2`` (every number from one run on one machine)::

    {"schema": "attnspec-bench/2", "attnspec": "2026.12.0", "created": ISO-8601,
     "machine": {"platform", "python", "cpus", "cpus_usable", "environment",
                 "load_average"}, "quick": bool,
     "config": {BenchConfig fields},
     "backends": {name: {"version", "device", "threads", "gemm_gflops", "memory_method"}},
     (gemm_gflops: the fastest square float32 product measured before and after each part)
     "measurements": [{"section": "dense" | "long" | "sparse" | "linear" | "kernel",
                       "backend", "impl", "length", "seconds", "first_seconds", "runs",
                       "peak_bytes", "skipped", "params", "gflops",
                       "fraction_of_gemm_peak", "relative_time", "relative_to"}],
     "check": [{"name", "target", "backend", "jobs", "options", "skipped", and where it ran:
                "command", "shell", "environment", "wall_seconds", "cpu_seconds",
                "load_before", "probe_seconds", "exit_status", "counts", "conforms",
                "complete", "runs": [{"wall_seconds", "cpu_seconds", "load_before",
                "probe_seconds", "exit_status"}]}],
     "targets": [{"name", "value", "limit", "met", "how"}]}

Dense, long and kernel measurements: ``impl`` is ``reference`` (the entry point
``scaled_dot_product_attention``), ``plain`` (``plain_attention``), ``torch_sdpa`` (PyTorch
SDPA on the same data: the yardstick of every backend), ``library`` (JAX's own kernel) or
``kernel`` (the user's); ``params`` names the ``case`` (dense, long) or ``workload``
(kernel) and, for a kernel, its name.  ``relative_time`` is the time over PyTorch SDPA's
at the same case (workload) and length, timed in the same rounds (None where it did not
run), and a sparse one's over the dense blocked reference given the pattern's mask.
``check`` holds the rows of the check section (one quick ``attnspec check`` each:
:mod:`attnspec.benchmarks.check_cost`), empty when it did not run; ``environment`` is what
the row changed (None: removed); a row's seconds are the median of its ``runs``, and
``probe_seconds`` the machine's speed before each (check_cost.speed_probe).
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
from dataclasses import asdict
from typing import Any

from .measure import (
    MIN_EXPONENT_LENGTHS,
    MIN_EXPONENT_SPAN,
    Measurement,
    attention_flops,
    power_law_exponent,
)
from .suites import BenchConfig

SCHEMA = "attnspec-bench/2"
TARGET_LENGTH = 4096
# issue 33: the entry point within 1.3x of PyTorch SDPA on torch, 1.2x on NumPy and JAX
# (B = 1, H = 8, E = 64, causal, float32, L = 4096, one thread), and L = 131072 in 2 GB
MAX_RELATIVE_TIME = {"torch": 1.3, "numpy": 1.2, "jax": 1.2}
MAX_PEAK_BYTES, MAX_EXPONENT = 2e9, 1.1
MAX_COLD_JAX_CHECK_SECONDS = 30.0
TIMED = ("dense", "long", "kernel")


def _shape(r: dict[str, Any], config: BenchConfig) -> tuple[int, int, int, int, bool]:
    """(batch x query heads, Lq, Lk, head dim, causal) of a dense, long or kernel record."""
    p = r["params"]
    if r["section"] == "kernel":
        return p["batch"] * p["heads"], p["n_queries"], r["length"], p["head_dim"], p["causal"]
    causal = not p["case"].startswith(("non-causal", "padding"))
    return config.batch * config.heads, r["length"], r["length"], config.head_dim, causal


def _dense_extras(
    records: list[dict[str, Any]], config: BenchConfig, backends: dict[str, dict[str, Any]]
) -> None:
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        p = r["params"]
        return r["section"], r["backend"], p.get("case") or p.get("workload"), r["length"]

    yardsticks = {key(r): r for r in records if r["section"] in TIMED and r["impl"] == "torch_sdpa"}
    for r in records:
        if r["section"] not in TIMED or not r["seconds"]:
            continue
        batch_heads, n_queries, n_keys, head_dim, causal = _shape(r, config)
        flops = attention_flops(batch_heads, n_queries, n_keys, head_dim, head_dim, causal)
        r["gflops"] = flops / r["seconds"] / 1e9
        peak = backends[r["backend"]].get("gemm_gflops")
        r["fraction_of_gemm_peak"] = r["gflops"] / peak if peak else None
        yardstick = yardsticks.get(key(r))
        if yardstick is not None and yardstick["seconds"] and r["impl"] != "torch_sdpa":
            r["relative_time"] = r["seconds"] / yardstick["seconds"]
            r["relative_to"] = yardstick["params"]["kernel"]


def _sparse_extras(records: list[dict[str, Any]]) -> None:
    dense = {
        r["params"]["pattern"]: r
        for r in records
        if r["section"] == "sparse" and r["impl"].startswith("dense blocked")
    }
    for r in records:
        base = dense.get(r["params"].get("pattern")) if r["section"] == "sparse" else None
        if base and r["seconds"] and base["seconds"]:
            r["relative_time"] = r["seconds"] / base["seconds"]
            r["relative_to"] = base["impl"]


def _target(name: str, value: float | None, limit: float, how: str) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "limit": limit,
        "met": None if value is None else bool(value <= limit),
        "how": how,
    }


def _check_targets(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        _target(
            f"quick check of the jitted JAX kernel, cold ({row['name']}): wall seconds",
            row.get("wall_seconds"),
            MAX_COLD_JAX_CHECK_SECONDS,
            "one `attnspec check` subprocess, no persistent compilation cache; the median "
            f"of {len(row.get('runs', [row]))} such runs",
        )
        for row in checks
        # the check as a user runs it: its default workers (a --jobs 1 row is for comparison)
        if row["backend"] == "jax"
        and "cold" in row["name"]
        and row.get("jobs") is None
        and row["skipped"] is None
    ]


def targets(
    records: list[dict[str, Any]], checks: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Issue 33's targets, evaluated on this run (None where the run did not measure it)."""
    found = _check_targets(checks or [])
    for r in records:
        reference = r["impl"] == "reference" and r["params"].get("case") == "causal"
        if (
            reference
            and r["section"] == "dense"
            and r["length"] == TARGET_LENGTH
            and r.get("relative_time") is not None
        ):
            found.append(
                _target(
                    f"scaled_dot_product_attention ({r['backend']}) / {r['relative_to']}, "
                    f"causal, L = {TARGET_LENGTH}",
                    r["relative_time"],
                    MAX_RELATIVE_TIME.get(r["backend"], max(MAX_RELATIVE_TIME.values())),
                    "fastest of the timed runs, interleaved in one process",
                )
            )
        if reference and r["section"] == "long" and r["seconds"]:
            found.append(
                _target(
                    f"scaled_dot_product_attention peak memory, causal, L = {r['length']} "
                    f"({r['backend']})",
                    r["peak_bytes"],
                    MAX_PEAK_BYTES,
                    "process peak RSS above the memory in use before the call (inputs not counted)",
                )
            )
    for impl in ("linear", "linear causal"):
        by_backend: dict[str, list[dict[str, Any]]] = {}
        for r in records:
            if r["section"] == "linear" and r["impl"] == impl and r["seconds"]:
                by_backend.setdefault(r["backend"], []).append(r)
        for backend, rows in by_backend.items():
            lengths = [r["length"] for r in rows]
            exponent = power_law_exponent(lengths, [r["seconds"] for r in rows])
            how = "least-squares slope of log t on log L"
            if exponent is None:
                how = (
                    f"not computed: {len(set(lengths))} lengths spanning "
                    f"{max(lengths) / min(lengths):.3g}x, fewer than {MIN_EXPONENT_LENGTHS} "
                    f"spanning {MIN_EXPONENT_SPAN}x"
                )
            found.append(
                _target(
                    f"{impl} attention time exponent over L = {min(lengths)}-{max(lengths)} "
                    f"({backend})",
                    exponent,
                    MAX_EXPONENT,
                    how,
                )
            )
    return found


THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "XLA_FLAGS")


def _machine() -> dict[str, Any]:
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "cpus_usable": None if affinity is None else len(affinity),
        "environment": {n: os.environ[n] for n in THREAD_VARIABLES if n in os.environ},
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def document(
    config: BenchConfig,
    quick: bool,
    backends: dict[str, dict[str, Any]],
    measurements: list[Measurement],
    version: str,
    checks: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    records = [m.to_dict() for m in measurements]
    for r in records:
        r.update(gflops=None, fraction_of_gemm_peak=None, relative_time=None, relative_to=None)
    _dense_extras(records, config, backends)
    _sparse_extras(records)
    return {
        "schema": SCHEMA,
        "attnspec": version,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(),
        "quick": quick,
        "config": asdict(config),
        "backends": backends,
        "measurements": records,
        "check": checks or [],
        "targets": targets(records, checks),
    }
