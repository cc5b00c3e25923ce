"""The ``check`` section of ``attnspec bench``: what one ``attnspec check`` costs.

Each row of the README's "Cost of a check" table is run as a subprocess,
``python -m attnspec.conformance.cli check TARGET --backend B --profile quick --quiet
--json FILE`` with the default workers and with ``--jobs 1``, one after the other.  A row
records its command line and environment, the wall seconds, the CPU seconds of the check
and its workers (the growth of ``getrusage(RUSAGE_CHILDREN)``, user + sys: every worker is
waited for by the check, the check by this process), the verdict counts of its JSON report,
the load average before it and the machine's single-thread speed just before it
(:func:`speed_probe`: the CPU seconds of a fixed pure-Python loop).  On this project's shared
2-core machine the same check's CPU seconds vary by up to ~1.4x from run to run, more than
the probe shows: two workers slow each other down by more at some times than at others.  A row of
``repeats`` runs records each run and reports the median.  JAX rows run cold (no persistent
compilation cache), then one run fills a fresh ``JAX_COMPILATION_CACHE_DIR`` and warm rows
reuse it.  A row whose
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
import statistics
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
JITTED_JAX = "attnspec.conformance.kernels.jax_jitted:jitted_dot_product_attention"
SDPA_MATH = "attnspec.conformance.kernels.torch_sdpa:sdpa_math"
BACKWARD = ("--backward",)
THREADS = "OMP_NUM_THREADS"
JAX_CACHE = "JAX_COMPILATION_CACHE_DIR"
# The variables that override a check's own choice of workers (ATTNSPEC_JOBS) and of its
# workers' threads (the rest: attnspec.conformance.run.supervisor.THREAD_VARIABLES, which this
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
    """One ``attnspec check`` to run ``repeats`` times (the median is the row's figure):
    ``jobs`` None means the check's default workers."""

    name: str
    target: str
    backend: str
    jobs: int | None = None
    environment: Mapping[str, str | None] = field(default_factory=dict)
    repeats: int = 1
    flags: tuple[str, ...] = ()  # beyond the config's options, e.g. --backward


@dataclass(frozen=True)
class CheckConfig:
    """The rows of the section and the options every check gets beyond the row's own."""

    rows: tuple[CheckRow, ...]
    options: tuple[str, ...] = ("--profile", "quick")


def _both_worker_counts(
    name: str,
    target: str,
    backend: str,
    environment: Mapping[str, str | None],
    repeats: int = 1,
) -> tuple[CheckRow, CheckRow]:
    return (
        CheckRow(f"{name}, default workers", target, backend, None, environment, repeats),
        CheckRow(f"{name}, --jobs 1", target, backend, 1, environment),
    )


COLD: dict[str, str | None] = {**CHECK_DEFAULTS, JAX_CACHE: UNSET}
COLD_REPEATS = 3
WARM: dict[str, str | None] = {**CHECK_DEFAULTS, JAX_CACHE: CACHE_DIR}
FULL = CheckConfig(
    rows=(
        *_both_worker_counts("numpy reference", REFERENCE, "numpy", CHECK_DEFAULTS),
        *_both_worker_counts("torch SDPA, 1 thread", TORCH_SDPA, "torch", ONE_THREAD),
        *_both_worker_counts("torch SDPA, default threads", TORCH_SDPA, "torch", CHECK_DEFAULTS),
        # issue 31's target: --backward at most 2x the forward-only profile, one worker each
        CheckRow("torch SDPA math, --jobs 1", SDPA_MATH, "torch", 1, CHECK_DEFAULTS),
        CheckRow(
            "torch SDPA math, --backward, --jobs 1",
            SDPA_MATH,
            "torch",
            1,
            CHECK_DEFAULTS,
            flags=BACKWARD,
        ),
        CheckRow("jax jitted, --backward, --jobs 1", JITTED_JAX, "jax", 1, COLD, flags=BACKWARD),
        # issue #11's target: cold, three times (the machine's speed varies from run to run)
        *_both_worker_counts("jax jitted, cold", JITTED_JAX, "jax", COLD, COLD_REPEATS),
        CheckRow("jax jitted, cache fill", JITTED_JAX, "jax", None, WARM),
        *_both_worker_counts("jax jitted, warm", JITTED_JAX, "jax", WARM),
    )
)
# Seconds, for tests: one property of the reference, each worker count (twice with the
# default workers).
QUICK = CheckConfig(
    rows=_both_worker_counts("numpy reference", REFERENCE, "numpy", CHECK_DEFAULTS, repeats=2),
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
        *row.flags,
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


# The loop speed_probe times: 0.08-0.15 s of CPU on this project's machine.
PROBE_ITERATIONS = 2_000_000


def speed_probe() -> float:
    """CPU seconds of a fixed pure-Python loop in this process: how fast the machine runs
    Python just now (the check's own work is mostly Python and XLA's compiler)."""
    started = time.process_time()
    total = 0
    for i in range(PROBE_ITERATIONS):
        total += i * i % 7
    return time.process_time() - started


def _run_once(argv: list[str], environment: dict[str, str], report: Path) -> dict[str, Any]:
    probe = speed_probe()
    load = os.getloadavg()
    cpu_before = _children_cpu_seconds()
    started = time.perf_counter()
    finished = subprocess.run(
        argv, env=environment, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    run: dict[str, Any] = {
        "wall_seconds": time.perf_counter() - started,
        "cpu_seconds": _children_cpu_seconds() - cpu_before,
        "load_before": list(load),
        "probe_seconds": probe,
        "exit_status": finished.returncode,
    }
    try:
        run["report"] = json.loads(report.read_text())
    except (OSError, ValueError):
        run["skipped"] = (
            f"no JSON report (exit status {finished.returncode}): "
            + (finished.stderr.strip().splitlines() or ["no output"])[-1]
        )
    return run


def _run_row(row: CheckRow, config: CheckConfig, report: Path, cache_dir: str) -> dict[str, Any]:
    argv = command_line(row, config, report)
    environment, changes = _environment(row, cache_dir)
    runs = []
    for _ in range(row.repeats):
        report.unlink(missing_ok=True)  # a run that writes none is not read as the last's
        runs.append(_run_once(argv, environment, report))
        if "skipped" in runs[-1]:
            break
    last = runs[-1]
    record: dict[str, Any] = {
        "command": argv,
        "shell": shell_line(argv, changes),
        "environment": changes,
        # the row's figures: the median run (each run's are in "runs")
        "wall_seconds": statistics.median(r["wall_seconds"] for r in runs),
        "cpu_seconds": statistics.median(r["cpu_seconds"] for r in runs),
        "load_before": runs[0]["load_before"],
        "probe_seconds": statistics.median(r["probe_seconds"] for r in runs),
        "exit_status": last["exit_status"],
        "runs": [{k: v for k, v in r.items() if k != "report"} for r in runs],
    }
    if "skipped" in last:
        record["skipped"] = last["skipped"]
        return record
    verdicts = last["report"]
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
                "options": [*config.options, *row.flags],
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
    walls = [r["wall_seconds"] for r in record["runs"]]
    spread = (
        f" (median of {len(walls)}: {min(walls):.1f}-{max(walls):.1f})" if len(walls) > 1 else ""
    )
    return line + (
        f"{record['wall_seconds']:6.1f} s wall{spread} {record['cpu_seconds']:6.1f} s CPU  "
        f"load {record['load_before'][0]:.1f}  probe {record['probe_seconds']:.2f} s  "
        f"{counts['passed']} passed, {counts['failed']} failed"
    )
