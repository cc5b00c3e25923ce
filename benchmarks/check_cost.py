"""The ``check`` section of ``attnspec bench``: what one ``attnspec check`` costs.

Each row of the README's "Cost of a check" table is run as a subprocess,
``python -m attnspec.conformance.cli check TARGET --backend B --profile quick --quiet
--json FILE`` with the default workers and with ``--jobs 1``, one after the other.  A row
records its command line and environment, the wall seconds, the CPU seconds of the check
and its workers (the growth of ``getrusage(RUSAGE_CHILDREN)``, user + sys: every worker is
waited for by the check, the check by this process), the verdict counts of its JSON report
and the load average before it.  JAX rows run cold (no persistent compilation cache), then
one run fills a fresh ``JAX_COMPILATION_CACHE_DIR`` and warm rows reuse it.  A row whose
library is not installed is kept, with the reason in ``skipped``, and not run (as is a check
that wrote no report).  No figure is drawn for
this section: its rows are the table.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Log = Callable[[str], None]

# In a row's environment: the value stands for the run's fresh JAX compilation cache dir.
CACHE_DIR = "{jax-cache}"
# In a row's environment: the variable is removed from the check's environment.
UNSET = None

REFERENCE = "attnspec.reference:scaled_dot_product_attention"
TORCH_SDPA = "torch.nn.functional:scaled_dot_product_attention"
JITTED_JAX = "attnspec.conformance.jax_kernels:jitted_dot_product_attention"
THREADS = "OMP_NUM_THREADS"
JAX_CACHE = "JAX_COMPILATION_CACHE_DIR"
# The variables that override a check's own choice of workers (ATTNSPEC_JOBS) and of its
# workers' threads (the rest: attnspec.conformance.isolation.THREAD_VARIABLES, which this
# layer may not import): every row removes them, so that its workers and threads are the
# check's defaults, or one thread where the row says so.
DEFAULT_OVERRIDES = (
    "ATTNSPEC_JOBS",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
CHECK_DEFAULTS: dict[str, str | None] = dict.fromkeys(DEFAULT_OVERRIDES, UNSET)
ONE_THREAD: dict[str, str | None] = {**CHECK_DEFAULTS, THREADS: "1"}


@dataclass(frozen=True)
class CheckRow:
    """One ``attnspec check`` to run: ``jobs`` None means the check's default workers."""

    name: str
    target: str
    backend: str
    jobs: int | None = None
    environment: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckConfig:
    """The rows of the section and the options every check gets beyond the row's own."""

    rows: tuple[CheckRow, ...]
    options: tuple[str, ...] = ("--profile", "quick")


def _both_worker_counts(
    name: str, target: str, backend: str, environment: Mapping[str, str | None]
) -> tuple[CheckRow, CheckRow]:
    return (
        CheckRow(f"{name}, default workers", target, backend, None, environment),
        CheckRow(f"{name}, --jobs 1", target, backend, 1, environment),
    )


COLD: dict[str, str | None] = {**CHECK_DEFAULTS, JAX_CACHE: UNSET}
WARM: dict[str, str | None] = {**CHECK_DEFAULTS, JAX_CACHE: CACHE_DIR}
FULL = CheckConfig(
    rows=(
        *_both_worker_counts("numpy reference", REFERENCE, "numpy", CHECK_DEFAULTS),
        *_both_worker_counts("torch SDPA, 1 thread", TORCH_SDPA, "torch", ONE_THREAD),
        *_both_worker_counts("torch SDPA, default threads", TORCH_SDPA, "torch", CHECK_DEFAULTS),
        *_both_worker_counts("jax jitted, cold", JITTED_JAX, "jax", COLD),
        CheckRow("jax jitted, cache fill", JITTED_JAX, "jax", None, WARM),
        *_both_worker_counts("jax jitted, warm", JITTED_JAX, "jax", WARM),
    )
)
# Seconds, for tests: one property of the reference, each worker count.
QUICK = CheckConfig(
    rows=_both_worker_counts("numpy reference", REFERENCE, "numpy", CHECK_DEFAULTS),
    options=("--profile", "quick", "--only", "default-scale"),
)


def unavailable(backend: str) -> str | None:
    """Why ``backend`` cannot be checked here (None when it can): its library is not
    installed.  Looked up without importing it: the checks run in their own processes, and
    a JAX loaded here would reserve most of a GPU's memory that they need."""
    if importlib.util.find_spec(backend) is None:
        return f"{backend} is not installed"
    return None


def command_line(row: CheckRow, config: CheckConfig, report: Path) -> list[str]:
    """The argv of the row's check, writing its JSON report to ``report``."""
    jobs = [] if row.jobs is None else ["--jobs", str(row.jobs)]
    return [
        sys.executable,
        "-m",
        "attnspec.conformance.cli",
        "check",
        row.target,
        "--backend",
        row.backend,
        *config.options,
        *jobs,
        "--quiet",
        "--json",
        str(report),
    ]


def _environment(row: CheckRow, cache_dir: str) -> tuple[dict[str, str], dict[str, str | None]]:
    """The check's whole environment and the row's changes to this one (cache dir filled in)."""
    changes = {
        name: cache_dir if value == CACHE_DIR else value
        for name, value in row.environment.items()
        if value is not UNSET or name in os.environ  # removing what is not there: no change
    }
    environment = dict(os.environ)
    for name, value in changes.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    return environment, changes


def shell_line(argv: list[str], changes: Mapping[str, str | None]) -> str:
    """``argv`` as a shell command, after ``env`` with the row's changes to the environment."""
    # env's options (-u NAME) come before its assignments
    prefix = [f"-u {name}" for name, value in changes.items() if value is None] + [
        f"{name}={shlex.quote(value)}" for name, value in changes.items() if value is not None
    ]
    return " ".join([*(["env", *prefix] if prefix else []), shlex.join(argv)])


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_row(row: CheckRow, config: CheckConfig, report: Path, cache_dir: str) -> dict[str, Any]:
    argv = command_line(row, config, report)
    environment, changes = _environment(row, cache_dir)
    load = os.getloadavg()
    cpu_before = _children_cpu_seconds()
    started = time.perf_counter()
    finished = subprocess.run(
        argv, env=environment, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - started
    cpu = _children_cpu_seconds() - cpu_before
    record: dict[str, Any] = {
        "command": argv,
        "shell": shell_line(argv, changes),
        "environment": changes,
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "load_before": list(load),
        "exit_status": finished.returncode,
    }
    try:
        verdicts = json.loads(report.read_text())
    except (OSError, ValueError):
        record["skipped"] = (
            f"no JSON report (exit status {finished.returncode}): "
            + (finished.stderr.strip().splitlines() or ["no output"])[-1]
        )
        return record
    record.update(
        counts=verdicts["counts"], conforms=verdicts["conforms"], complete=verdicts["complete"]
    )
    return record


def check(
    config: CheckConfig,
    out: Path,
    log: Log,
    saved: Callable[[list[dict[str, Any]]], None] = lambda records: None,
) -> list[dict[str, Any]]:
    """Run every row of ``config`` (JSON reports under ``out``); one record per row, given
    to ``saved`` after each row, so that an interrupted run keeps what it measured."""
    reports = out / "check-reports"
    reports.mkdir(parents=True, exist_ok=True)
    reasons = {b: unavailable(b) for b in dict.fromkeys(r.backend for r in config.rows)}
    records = []
    with tempfile.TemporaryDirectory(prefix="attnspec-jax-cache-") as cache_dir:
        for index, row in enumerate(config.rows):
            record: dict[str, Any] = {
                "name": row.name,
                "target": row.target,
                "backend": row.backend,
                "jobs": row.jobs,
                "options": list(config.options),
                "skipped": reasons[row.backend],
            }
            if record["skipped"] is None:
                report = reports / f"check-{index:02d}.json"
                record.update(_run_row(row, config, report, cache_dir))
            records.append(record)
            saved(records)
            log(summary(record))
    return records


def summary(record: dict[str, Any]) -> str:
    """One log line of a row."""
    line = f"  {record['name']:46}"
    if record["skipped"] is not None:
        return line + f"skipped: {record['skipped']}"
    counts = record["counts"]
    return line + (
        f"{record['wall_seconds']:6.1f} s wall {record['cpu_seconds']:6.1f} s CPU  "
        f"load {record['load_before'][0]:.1f}  "
        f"{counts['passed']} passed, {counts['failed']} failed"
    )
