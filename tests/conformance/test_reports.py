"""Reports never lose a verdict (CONF-6).

Report paths are checked before anything runs; every report is rewritten atomically
after each property and says it is incomplete until the run has finished; Ctrl-C and
SIGTERM leave the finished verdicts on disk and in the table, marked incomplete, exit
2; a report that cannot be written later is one line and exit 2 while the other reports
are still written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support import (
    ATTNSPEC,
    kernel_file,
    processes_left_in,
    report_of,
    start_cli,
    wait_for,
)

from attnspec.conformance import cli
from attnspec.conformance.judge.verdict import PASSED, Verdict
from attnspec.conformance.report.files import ReportFiles, write_atomically

KERNELS = """
import os, time
from attnspec.reference import scaled_dot_product_attention


def hangs_on_explicit_scale(q, k, v, *, mask=None, is_causal=False, scale=None):
    while scale is not None:
        time.sleep(1)
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)


def blocks_its_json_report(q, k, v, *, mask=None, is_causal=False, scale=None):
    path = os.environ["JSON_REPORT"]  # the report path: from now on a directory
    if not os.path.isdir(path):
        os.remove(path)
        os.mkdir(path)
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
"""
REPORTS = ("--json", "r.json", "--junit", "r.xml", "--markdown", "r.md")


@pytest.fixture
def kernels(tmp_path: Path) -> str:
    return str(kernel_file(tmp_path, "kernels.py", KERNELS))


def junit_properties(path: Path) -> dict[str, str]:
    root = ET.parse(path).getroot()
    return {p.get("name", ""): p.get("value", "") for p in root.iter("property")}


def temporary_files(directory: Path) -> list[str]:
    """Files the atomic writes would leave behind if they did not clean up."""
    return [p.name for p in directory.iterdir() if p.name.endswith((".tmp", ".probe"))]


@pytest.mark.parametrize(
    "make, args, words",
    [
        (lambda d: (d / "sub").mkdir(), ("--json", "sub"), "is a directory, but should be a file"),
        (lambda d: None, ("--junit", "missing/r.xml"), "directory 'missing' does not exist"),
        (
            lambda d: (d / "file").write_text(""),
            ("--markdown", "file/r.md"),
            "directory 'file' does not exist",
        ),
        (lambda d: None, ("--json", "same", "--junit", "./same"), "--json writes the same file"),
    ],
)
def test_report_paths_are_checked_before_anything_runs(
    make,
    args: tuple[str, ...],
    words: str,
    kernels: str,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A report path that cannot be written: exit 2 and one line, before any property ran
    (no progress line), so no verdict is computed for a report that cannot be saved."""
    monkeypatch.chdir(tmp_path)
    make(tmp_path)
    status = cli.main(["check", f"{kernels}:hangs_on_explicit_scale", *args])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and words in lines[0], lines
    assert captured.out == ""


def test_unwritable_directory_is_found_before_the_run(
    kernels: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A directory that exists but cannot be written in (here /proc): exit 2, one line."""
    if not Path("/proc").is_dir():
        pytest.skip("needs Linux /proc as a directory nobody can create files in")
    status = cli.main(
        ["check", f"{kernels}:hangs_on_explicit_scale", "--json", "/proc/attnspec-report.json"]
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "cannot write in '/proc'" in lines[0], lines


@pytest.mark.parametrize(
    "signum, name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT (Ctrl-C)")]
)
def test_interrupt_keeps_finished_verdicts_marked_incomplete(
    signum: int,
    name: str,
    kernels: str,
    tmp_path: Path,
) -> None:
    """CONF-6: while a property hangs, the reports already hold the finished one and say
    the check is still running; SIGTERM or Ctrl-C then ends the check with exit 2, the
    table and the reports show the finished verdicts, marked incomplete, and no worker
    process or temporary file is left behind."""
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        process = start_cli(
            [
                "check",
                f"{kernels}:hangs_on_explicit_scale",
                "--backend",
                "numpy",
                "--only",
                "default-scale,explicit-scale",
                "--timeout",
                "300",
                *REPORTS,
            ],
            tmp_path,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    try:
        wait_for(tmp_path / "r.md", "1 of 2")  # the last file written after default-scale
        running = json.loads((tmp_path / "r.json").read_text())
        assert [v["property"] for v in running["verdicts"]] == ["default-scale"]
        assert running["complete"] is False and running["conforms"] is False
        assert running["incomplete"].startswith("the check was still running: 1 of 2")
        assert junit_properties(tmp_path / "r.xml")["complete"] == "False"
        # Signalled only once the hanging property has started: a signal between the
        # report write and this line would leave no log of which property hung.
        wait_for(log, "[2/2] explicit-scale (SDPA-2.2) ...")
        process.send_signal(signum)
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    err = log.read_text()
    assert process.returncode == 2, err
    final = json.loads((tmp_path / "r.json").read_text())
    reason = f"interrupted by {name} after 1 of 2 properties"
    assert final["incomplete"] == reason and final["complete"] is False
    assert [(v["property"], v["status"]) for v in final["verdicts"]] == [("default-scale", PASSED)]
    assert junit_properties(tmp_path / "r.xml")["complete"] == "False"
    assert f"result: INCOMPLETE ({reason})" in (tmp_path / "r.md").read_text()
    assert f"result: INCOMPLETE ({reason})" in out
    assert "no conformance claim: the check is incomplete (CONF-6)" in out
    assert f"attnspec: {reason}" in err and "Traceback" not in err
    assert "explicit-scale (SDPA-2.2) ..." in err  # a log shows which property hung
    assert temporary_files(tmp_path) == []
    assert processes_left_in(tmp_path, within=0.5) == []


def test_an_interrupt_while_failures_are_re_run_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """CONF-6: SIGTERM arriving once every property has its verdict, while a failure is re-run
    around another failed clause (root_causes.draw_around), ends the check with exit 2 and
    reports marked incomplete with that reason; the failure stays as it was found.  No kernel
    can tell a re-run from the first run (CONF-14), so the check's own process is signalled
    as the re-runs start: the signal lands where a user's Ctrl-C would."""
    from attnspec.conformance.run import root_causes

    settled = root_causes._settled
    re_run: list[str] = []

    def signalled_at_the_first_re_run(report: object, found: Verdict, *rest: object) -> Verdict:
        re_run.append(found.property)
        os.kill(os.getpid(), signal.SIGTERM)
        return settled(report, found, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(root_causes, "_settled", signalled_at_the_first_re_run)
    monkeypatch.chdir(tmp_path)
    status = cli.main(
        [
            "check",
            "catalogue.bugs_softmax:finite_fill_jax_style",  # mean(V) on fully masked rows
            "--backend",
            "numpy",
            "--profile",
            "quick",
            "--only",
            "empty-rows-zero",
            "--no-isolate",
            "--json",
            "r.json",
        ]
    )
    out = capsys.readouterr().out
    assert status == 2 and re_run == ["empty-rows-zero"], out[-1500:]
    final = json.loads((tmp_path / "r.json").read_text())
    reason = (
        "interrupted by SIGTERM after 1 of 1 properties, while their failures were re-run "
        "around other failed clauses"
    )
    assert final["incomplete"] == reason and final["complete"] is False
    assert [(v["property"], v["status"], v["drawn_around"]) for v in final["verdicts"]] == [
        ("empty-rows-zero", "failed", "")
    ]
    assert f"result: INCOMPLETE ({reason})" in out


def test_a_killed_check_leaves_an_incomplete_report_and_no_worker(
    kernels: str,
    tmp_path: Path,
) -> None:
    """CONF-6: a report from an earlier run is replaced as soon as the kernel is loaded, so
    a check killed outright (SIGKILL: nothing can be saved then) during its first property
    leaves a report saying it was still running, not a stale one; its worker, orphaned,
    exits on its own."""
    (tmp_path / "r.json").write_text('{"stale": true}')
    process = subprocess.Popen(
        [
            ATTNSPEC,
            "check",
            f"{kernels}:hangs_on_explicit_scale",
            "--backend",
            "numpy",
            "--only",
            "explicit-scale",
            "--timeout",
            "300",
            *REPORTS,
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(tmp_path / "r.md", "0 of 1")
        time.sleep(0.5)  # into the hanging call
    finally:
        process.kill()
        process.wait()
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdicts"] == [] and report["complete"] is False
    assert report["incomplete"].startswith("the check was still running: 0 of 1")
    assert processes_left_in(tmp_path, within=30) == [], "the orphaned worker did not exit"


def test_finished_reports_are_complete(
    kernels: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a finished run every report says complete, and no temporary file is left.
    The kernel in this process (--no-isolate): the reports are written by the command's
    process either way, and a worker and a kernel process cost ~0.5 CPU-s."""
    monkeypatch.chdir(tmp_path)
    status = cli.main(
        [
            *("check", f"{kernels}:hangs_on_explicit_scale", "--only", "default-scale"),
            *(*REPORTS, "--no-isolate"),
        ]
    )
    capsys.readouterr()
    assert status == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["complete"] is True and data["incomplete"] == "" and data["conforms"] is True
    assert junit_properties(tmp_path / "r.xml")["complete"] == "True"
    assert "result: conforms" in (tmp_path / "r.md").read_text()
    assert temporary_files(tmp_path) == []


def test_a_report_that_cannot_be_written_later_is_one_line_and_exit_2(
    kernels: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The JSON path becomes a directory during the run: one line naming it, exit 2, and
    the JUnit and Markdown reports are still written, complete.  The kernel, which turns
    the path into a directory, in this process (--no-isolate): the reports are written by
    the command's process either way, and a worker and a kernel process cost ~0.5 CPU-s."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JSON_REPORT", str(tmp_path / "r.json"))
    status = cli.main(
        [
            "check",
            f"{kernels}:blocks_its_json_report",
            "--only",
            "default-scale,explicit-scale",
            *REPORTS,
            "--no-isolate",
        ]
    )
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if "error" in line]
    assert status == 2
    assert errors == [
        "attnspec: error: --json 'r.json': the report could not be written: Is a directory"
    ]
    assert "result: conforms" in captured.out  # the verdicts themselves are fine
    assert junit_properties(tmp_path / "r.xml")["complete"] == "True"
    assert "explicit-scale" in (tmp_path / "r.md").read_text()


def test_write_atomically_leaves_the_old_file_when_a_write_fails(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed write (disk full, here a failing rename) keeps the previous report whole
    and removes its temporary file."""
    path = tmp_path / "r.json"
    write_atomically(path, "old")

    def full_disk(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_report_files_remember_only_the_latest_failure(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A write that fails, then succeeds (space freed), leaves no error behind; the other
    file is written either way."""
    files = ReportFiles(
        [
            ("--json", tmp_path / "a", lambda r, rerun: "a"),
            ("--markdown", tmp_path / "b", lambda r, rerun: "b"),
        ]
    )
    report = report_of([Verdict("p", "SDPA-2.1", "MUST", PASSED)])
    real_replace = os.replace

    def fail_for_a(src: str, dst: str) -> None:
        if Path(dst).name == "a":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_for_a)
    files.write(report, incomplete="still running")
    assert list(files.errors) == ["--json"] and (tmp_path / "b").read_text() == "b"
    monkeypatch.setattr(os, "replace", real_replace)
    files.write(report)
    assert files.errors == {} and (tmp_path / "a").read_text() == "a"


def test_background_writes_keep_the_latest_version(tmp_path: Path) -> None:
    """CONF-6: while the run goes on, the report file gets the latest version submitted
    (a version overtaken while a write was under way is skipped, never written after a
    newer one), copied as it was when submitted; after close, nothing more is written."""
    from attnspec.conformance.report.files import BackgroundWrites

    written: list[int] = []

    def render(report: object, rerun: object) -> str:
        time.sleep(0.01)  # a slow render, so that versions overtake each other
        count = len(report.verdicts)  # type: ignore[attr-defined]
        written.append(count)
        return str(count)

    writes = BackgroundWrites(ReportFiles([("--json", tmp_path / "r", render)]))
    report = report_of([])
    for _ in range(20):
        report.verdicts.append(Verdict("p", "SDPA-2.1", "MUST", PASSED))
        writes.submit(report, None, "still running")
    report.verdicts.append(Verdict("q", "SDPA-2.1", "MUST", PASSED))  # not submitted
    deadline = time.monotonic() + 30
    while 20 not in written:
        assert time.monotonic() < deadline, written
        time.sleep(0.01)
    writes.close()
    assert written == sorted(written) and written[-1] == 20 and len(written) < 20
    writes.submit(report, None, "still running")
    assert (tmp_path / "r").read_text() == "20"
