"""The JSON document of a benchmark run: measurements, derived ratios and the targets.

Schema ``attnspec-bench/1`` (every number from one run on one machine)::

    {"schema": "attnspec-bench/1", "attnspec": "2026.12.0", "created": ISO-8601,
     "machine": {"platform", "python", "cpus", "cpus_usable", "environment"}, "quick": bool,
     "config": {BenchConfig fields},
     "backends": {name: {"version", "device", "threads", "gemm_gflops", "memory_method"}},
     (gemm_gflops: the fastest square float32 product measured before and after each part)
     "measurements": [{"section": "dense" | "sparse" | "linear", "backend", "impl",
                       "length", "seconds", "first_seconds", "runs", "peak_bytes",
                       "skipped", "params", "gflops", "fraction_of_gemm_peak",
                       "relative_time", "relative_to"}],
     "check": [{"name", "target", "backend", "jobs", "options", "skipped", and where it ran:
                "command", "shell", "environment", "wall_seconds", "cpu_seconds",
                "load_before", "probe_seconds", "exit_status", "counts", "conforms",
                "complete", "runs": [{"wall_seconds", "cpu_seconds", "load_before",
                "probe_seconds", "exit_status"}]}],
     "targets": [{"name", "value", "limit", "met", "how"}]}

``relative_time`` is a dense measurement's time over the library's kernel at the same length,
timed in the same rounds (for NumPy, which has none, torch SDPA on the same memory; None
where the kernel did not fit), and a sparse one's over the dense blocked reference given
the pattern's mask.  ``check`` holds the rows of the check section (one quick
``attnspec check`` each: :mod:`attnspec.benchmarks.check_cost`), empty when it did not run;
``environment`` is what the row changed (None: removed); a row's seconds are the median of
its ``runs``, and ``probe_seconds`` the machine's speed before each (check_cost.speed_probe).
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
from dataclasses import asdict
from typing import Any

from .measure import Measurement, attention_flops, power_law_exponent
from .suites import BenchConfig

SCHEMA = "attnspec-bench/1"
TARGET_LENGTH, LONG_LENGTH = 4096, 32768
MAX_RELATIVE_TIME, MAX_PEAK_BYTES, MAX_EXPONENT = 3.0, 2e9, 1.1
MAX_COLD_JAX_CHECK_SECONDS = 30.0


def _dense_extras(
    records: list[dict[str, Any]], config: BenchConfig, backends: dict[str, dict[str, Any]]
) -> None:
    kernels = {
        (r["backend"], r["length"]): r
        for r in records
        if r["section"] == "dense" and r["impl"] == "framework" and r["seconds"]
    }
    for r in records:
        if r["section"] != "dense" or not r["seconds"]:
            continue
        flops = attention_flops(
            config.batch * config.heads,
            r["length"],
            r["length"],
            config.head_dim,
            config.head_dim,
            config.causal,
        )
        r["gflops"] = flops / r["seconds"] / 1e9
        peak = backends[r["backend"]].get("gemm_gflops")
        r["fraction_of_gemm_peak"] = r["gflops"] / peak if peak else None
        kernel = kernels.get((r["backend"], r["length"]))
        if kernel is not None and r["impl"] != "framework":
            r["relative_time"] = r["seconds"] / kernel["seconds"]
            r["relative_to"] = kernel["params"]["framework"]


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
    """Issue 11's targets, evaluated on this run (None where the run did not measure it)."""
    found = _check_targets(checks or [])
    for r in records:
        if (
            r["section"] == "dense"
            and r["impl"] == "blocked"
            and r["length"] == TARGET_LENGTH
            and r.get("relative_time") is not None
        ):
            found.append(
                _target(
                    f"blocked reference ({r['backend']}) / {r['relative_to']} "
                    f"at L = {TARGET_LENGTH}",
                    r["relative_time"],
                    MAX_RELATIVE_TIME,
                    "fastest of the timed runs, one process",
                )
            )
        if r["section"] == "dense" and r["impl"] == "blocked" and r["length"] == LONG_LENGTH:
            found.append(
                _target(
                    f"blocked reference peak memory at L = {LONG_LENGTH} ({r['backend']})",
                    r["peak_bytes"],
                    MAX_PEAK_BYTES,
                    "peak above the memory in use before the call",
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
            found.append(
                _target(
                    f"{impl} attention time exponent over L = {min(lengths)}-{max(lengths)} "
                    f"({backend})",
                    exponent,
                    MAX_EXPONENT,
                    "least-squares slope of log t on log L",
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
