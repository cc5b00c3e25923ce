"""``attnspec bench --sections check``: the cost of an ``attnspec check``, measured.

Not a spec clause: issue #11 asks that the README's "Cost of a check" figures be measured
by the benchmark command.  These tests pin the section's contract: each row ran as a
subprocess whose recorded command reproduces its verdicts, with positive wall and CPU
times; a row whose library is missing is kept with the reason; JAX rows go cold, fill,
warm; bad ``--sections`` values are named.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest

from attnspec.benchmarks import check_cost
from attnspec.benchmarks.report import MAX_COLD_JAX_CHECK_SECONDS, targets
from attnspec.conformance.cli import main
from attnspec.conformance.run.supervisor import THREAD_VARIABLES


def run_check_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[list[dict[str, Any]], str]:
    out = tmp_path / "bench"
    status = main(["bench", "--quick", "--sections", "check", "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    doc = json.loads((out / "bench.json").read_text())
    assert doc["measurements"] == [] and doc["backends"] == {}, doc
    return doc["check"], printed


def test_quick_check_section_rows_reproduce(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every QUICK row ran as often as it says (the first twice): positive wall and CPU
    seconds each run (the check's workers are its children), the row's the median of its
    runs, its verdict counts, the load and the speed probe before each run; its recorded
    command, run again, gives the same counts."""
    rows, printed = run_check_section(tmp_path, capsys)
    assert [r["name"] for r in rows] == [r.name for r in check_cost.QUICK.rows]
    assert [len(r["runs"]) for r in rows] == [r.repeats for r in check_cost.QUICK.rows] == [2, 1]
    for row in rows:
        assert row["skipped"] is None and row["exit_status"] == 0, row
        for run in row["runs"]:
            assert run["wall_seconds"] > 0 and run["cpu_seconds"] > 0, row
            assert len(run["load_before"]) == 3 and run["probe_seconds"] > 0, row
        for figure in ("wall_seconds", "cpu_seconds", "probe_seconds"):
            assert row[figure] == statistics.median(run[figure] for run in row["runs"]), row
        assert row["counts"]["passed"] >= 1, row
        assert row["name"] in printed and f"{row['counts']['passed']} passed" in printed
    assert "(median of 2: " in printed
    again = rows[-1]
    report = Path(again["command"][again["command"].index("--json") + 1])
    report.unlink()
    environment = {**os.environ, **again["environment"]}
    subprocess.run(
        again["command"],
        env={name: value for name, value in environment.items() if value is not None},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=True,
    )
    assert json.loads(report.read_text())["counts"] == again["counts"]


def test_row_of_a_missing_library_is_skipped_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row on a backend that cannot load is in the JSON with the reason, and not run."""
    row = check_cost.CheckRow("missing library", "somewhere:kernel", "no-such-library")
    monkeypatch.setattr(check_cost, "QUICK", check_cost.CheckConfig(rows=(row,)))
    rows, printed = run_check_section(tmp_path, capsys)
    assert len(rows) == 1 and "no-such-library" in rows[0]["skipped"], rows
    assert "wall_seconds" not in rows[0] and "command" not in rows[0]
    assert "missing library" in printed and "skipped:" in printed


def test_full_rows_are_the_readme_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """FULL has the README's rows, each with the default workers and --jobs 1: the NumPy
    reference, torch SDPA at one thread and at the default threads, the jitted JAX kernel
    cold (no cache), then one fill of a fresh cache dir before the warm rows that reuse it.
    (Checked with every library 'missing', so nothing runs.)"""
    monkeypatch.setattr(check_cost, "unavailable", lambda backend: f"{backend}: simulated")
    saved: list[int] = []
    rows = check_cost.check(
        check_cost.FULL, tmp_path, lambda line: None, lambda rows: saved.append(len(rows))
    )
    assert saved == list(range(1, len(rows) + 1))  # after every row: an interrupt keeps them
    assert all(r["skipped"] == f"{r['backend']}: simulated" for r in rows)
    table = [(r.target, r.backend, dict(r.environment), r.jobs) for r in check_cost.FULL.rows]
    expected = [
        (check_cost.REFERENCE, "numpy", check_cost.CHECK_DEFAULTS),
        (check_cost.TORCH_SDPA, "torch", {**check_cost.CHECK_DEFAULTS, "OMP_NUM_THREADS": "1"}),
        (check_cost.TORCH_SDPA, "torch", check_cost.CHECK_DEFAULTS),
        (check_cost.JITTED_JAX, "jax", check_cost.COLD),
        (check_cost.JITTED_JAX, "jax", check_cost.WARM),
    ]
    for target, backend, environment in expected:
        jobs = {j for t, b, e, j in table if (t, b, e) == (target, backend, environment)}
        assert jobs == {None, 1}, (target, environment)
    cache = check_cost.JAX_CACHE
    assert check_cost.COLD[cache] is None and check_cost.WARM[cache] == check_cost.CACHE_DIR
    names = [r.name for r in check_cost.FULL.rows]
    fill = names.index("jax jitted, cache fill")
    assert table[fill][2] == check_cost.WARM
    assert fill == max(i for i, n in enumerate(names) if "cold" in n) + 1
    assert all("warm" in n for n in names[fill + 1 :]) and len(names) == fill + 3
    assert check_cost.FULL.options == ("--profile", "quick")
    # BWD-1 (issue 31): --backward against the forward-only profile, one worker each, on
    # PyTorch's math SDPA and the cold jitted JAX kernel (whose forward row is above)
    backward = [(r.target, r.jobs, r.environment) for r in check_cost.FULL.rows if r.flags]
    assert backward == [
        (check_cost.SDPA_MATH, 1, check_cost.CHECK_DEFAULTS),
        (check_cost.JITTED_JAX, 1, check_cost.COLD),
    ]
    assert all(r.flags == ("--backward",) for r in check_cost.FULL.rows if r.flags)
    assert (check_cost.SDPA_MATH, 1, ()) in [
        (r.target, r.jobs, r.flags) for r in check_cost.FULL.rows
    ]
    # issue #11's target row runs three times; every other row once
    repeated = {r.name: r.repeats for r in check_cost.FULL.rows if r.repeats != 1}
    assert repeated == {"jax jitted, cold, default workers": 3}


def test_rows_remove_what_overrides_the_checks_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every thread variable a check's workers obey, and ATTNSPEC_JOBS, is removed from a
    row's environment where it is set (and recorded so); one not set is no change."""
    assert set(THREAD_VARIABLES) | {"ATTNSPEC_JOBS"} == set(check_cost.DEFAULT_OVERRIDES)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    for name in ("OMP_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    row = check_cost.CheckRow("one thread", "m:f", "torch", environment=check_cost.ONE_THREAD)
    environment, changes = check_cost._environment(row, "/cache")
    assert changes["MKL_NUM_THREADS"] is None and "MKL_NUM_THREADS" not in environment
    assert environment["OMP_NUM_THREADS"] == changes["OMP_NUM_THREADS"] == "1"
    assert "NUMEXPR_NUM_THREADS" not in changes
    warm = check_cost.CheckRow("warm", "m:f", "jax", environment=check_cost.WARM)
    assert check_cost._environment(warm, "/cache")[0][check_cost.JAX_CACHE] == "/cache"


def test_shell_line_unsets_before_it_sets() -> None:
    """The recorded shell command: env's -u options first, then the assignments."""
    line = check_cost.shell_line(["python", "-c", "pass"], {"A": "1 2", "B": None})
    assert line == "env -u B A='1 2' python -c pass"
    assert check_cost.shell_line(["python"], {}) == "python"


def test_cold_jax_check_target() -> None:
    """Issue #11's target for the jitted JAX kernel's cold quick check, from the row with
    the check's default workers (the median of its runs); the --jobs 1 and warm rows are
    for comparison, not the target."""
    rows = [
        {"name": "jax jitted, cold, default workers", "backend": "jax", "jobs": None,
         "skipped": None, "wall_seconds": MAX_COLD_JAX_CHECK_SECONDS * 2, "runs": [{}] * 3},
        {"name": "jax jitted, cold, --jobs 1", "backend": "jax", "jobs": 1, "skipped": None,
         "wall_seconds": 1.0},
        {"name": "jax jitted, warm, default workers", "backend": "jax", "jobs": None,
         "skipped": None, "wall_seconds": 1.0},
    ]  # fmt: skip
    (target,) = targets([], rows)
    assert target["met"] is False and target["value"] == MAX_COLD_JAX_CHECK_SECONDS * 2
    assert "cold, default workers" in target["name"] and "median of 3" in target["how"]


def test_bad_section_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["bench", "--quick", "--out", str(tmp_path), "--sections", "check,chek"])
    assert status == 2
    err = capsys.readouterr().err
    assert "--sections: unknown chek" in err and "check" in err.split("expected of")[1]
