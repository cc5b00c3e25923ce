"""A run ends in bounded time with a complete report, and nothing a kernel started outlives
it (CONF-15, CONF-5, CONF-6, CONF-9); ``--judge`` judges with the strictest settings (SDPA-7.5)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from catalogue import forgers, hostile
from support import SMALL_SIZE_FLAGS, run_main

HOSTILE_FILE = str(Path(hostile.__file__).resolve())
FORGERS_FILE = str(Path(forgers.__file__).resolve())


def test_a_kernel_that_hangs_on_every_call_stops_at_the_stall_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CONF-15: a kernel that never returns costs --stall-budget timeouts, not one
    per property: the properties it hung in FAILED (stalled, on the inputs named), every
    other one "not run" with the reason, exit 1, a complete report.  The command in this
    process (the kernel hangs in a process of its own, as always): what is checked is how
    many stalls the run takes, not the command's process."""
    report_file = tmp_path / "report.json"
    started = time.monotonic()
    status, out, err = run_main(
        capsys,
        "check",
        f"{HOSTILE_FILE}:hangs",
        "--backend",
        "numpy",
        "--profile",
        "quick",
        "--timeout",
        "1",  # s: every call hangs, each stall costs this much
        "--stall-budget",
        "2",
        "--jobs",
        "1",
        "--json",
        str(report_file),
    )
    took = time.monotonic() - started
    assert status == 1, out[-2000:] + err[-2000:]
    report = json.loads(report_file.read_text())
    assert report["complete"] is True
    stalled = [v for v in report["verdicts"] if v.get("stalled")]
    not_run = [v for v in report["verdicts"] if v["status"] == "not run"]
    assert len(stalled) == 2 and all(v["status"] == "failed" for v in stalled)
    # the "hangs" verdict names the inputs the kernel hung on (issue 29)
    assert all("did not return within 1 s" in v["detail"] for v in stalled), stalled
    assert all(v["counterexample"].startswith("q(") for v in stalled), stalled
    assert len(not_run) > 10
    assert all("stall budget" in v["detail"] for v in not_run)
    assert took < 300, took


def test_nothing_the_kernel_started_outlives_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONF-15: a kernel that starts a process of its own (in a new session, so a kill of
    its process group does not reach it) and one that hangs: after the check, neither
    child is alive, and no temporary directory of the kernel's process is left.  The
    command in this process (its judging worker, which starts and ends the kernel's
    process, and the kernel's process in processes of their own, started with TMPDIR set
    here): what is checked is what outlives the kernel's process, not the command's."""
    pids = tmp_path / "pids.txt"
    kernel = tmp_path / "spawner.py"
    kernel.write_text(
        "import os, subprocess, time\n"
        "from attnspec.reference import scaled_dot_product_attention\n"
        "def attention(q, k, v, *, mask=None, is_causal=False, scale=None):\n"
        "    child = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        f"    with open({str(pids)!r}, 'a') as f:\n"
        "        f.write(f'{child.pid}\\n')\n"
        "    options = dict(mask=mask, is_causal=is_causal, scale=scale)\n"
        "    return scaled_dot_product_attention(q, k, v, **options)\n"
    )
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(scratch))
    status, out, err = run_main(
        capsys, "check", f"{kernel}:attention", "--backend", "numpy", "--only", "default-scale"
    )
    assert status == 0, out[-2000:] + err[-2000:]
    started = [int(line) for line in pids.read_text().split()]
    assert started
    alive = [pid for pid in started if _alive(pid)]
    assert not alive, f"processes the kernel started are still running: {alive}"
    left = [p.name for p in scratch.iterdir() if p.name.startswith("attnspec-kernel-")]
    assert not left, left


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_judge_mode_repeats_each_call_and_compares_the_results(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SDPA-7.5 under --judge: a kernel one unit in the last place off on every other call
    fails matches-reference, which alone (one call per input, within TOL-2) it passes.
    The command in this process (its kernel in a process of its own, as always): what is
    checked is the judge's settings, not the command's process."""
    argv = (
        "check",
        f"{FORGERS_FILE}:differs_on_every_other_call",
        "--backend",
        "numpy",
        "--only",
        "matches-reference",
        "--dtype",
        "float32",
        *SMALL_SIZE_FLAGS,  # the plain run passes every stratum and anchor: cut to small sizes
    )
    status, out, _ = run_main(capsys, *argv)
    assert status == 0, out[-2000:]
    status, out, _ = run_main(capsys, *argv, "--judge")
    assert status == 1, out[-2000:]
    assert "made twice on fresh copies" in out


def test_deadline_stops_starting_properties(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """CONF-15, CONF-6: past --deadline no property starts; those left are "not run" and, nothing
    having failed, the report is incomplete (exit 2).  The command in this process: what
    is checked is when properties start, not the command's process."""
    report_file = tmp_path / "report.json"
    status, out, _ = run_main(
        capsys,
        "check",
        f"{HOSTILE_FILE}:attention",
        "--backend",
        "numpy",
        "--only",
        "default-scale,explicit-scale,causal-zeros",
        "--deadline",
        "0.001",
        "--json",
        str(report_file),
    )
    report = json.loads(report_file.read_text())
    statuses = [v["status"] for v in report["verdicts"]]
    assert statuses == ["not run"] * 3, statuses
    assert status == 2, out[-1500:]
