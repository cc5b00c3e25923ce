"""The kernels the tests of the ``attnspec`` command check (a file in ``tmp_path``), the
report files they ask for, and the one failing check that several of them read."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from support import CHEAP, KERNELS, CheckRun, kernel_file

from attnspec.conformance import cli


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    return kernel_file(tmp_path, "kernels.py", KERNELS)


@pytest.fixture
def report_files(tmp_path: Path) -> tuple[dict[str, Path], tuple[str, ...]]:
    """Where a check's JSON, JUnit and Markdown reports go in ``tmp_path`` (by kind), and
    the --json, --junit and --markdown flags that ask for them there."""
    paths = {kind: tmp_path / f"report.{kind}" for kind in ("json", "junit", "markdown")}
    return paths, tuple(a for kind, path in paths.items() for a in (f"--{kind}", str(path)))


UNSCALED_FLAGS = ("--only", CHEAP, "--seed", "7", "--no-mask")


@pytest.fixture(scope="session")
def unscaled_run(tmp_path_factory: pytest.TempPathFactory) -> CheckRun:
    """``attnspec check kernels.py:no_default_scale --only CHEAP --seed 7 --no-mask`` with
    every report file, the command in this process (the kernel in its own, as always),
    run from the directory holding the kernel: a relative target, so its rerun command and
    reproduction are shown to work from elsewhere.  SDPA-2.1's failing check that the
    tests of its exit status, table, rerun command, reproduction and report files read
    (test_check.py, test_check_report.py): one run, not one each (~1.1 CPU-s a check)."""
    cwd = tmp_path_factory.mktemp("unscaled")
    kernel_file(cwd, "kernels.py", KERNELS)
    reports = {kind: cwd / f"report.{kind}" for kind in ("json", "junit", "markdown")}
    files = tuple(a for kind, path in reports.items() for a in (f"--{kind}", str(path)))
    out, err = io.StringIO(), io.StringIO()
    with (
        pytest.MonkeyPatch.context() as patch,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        patch.chdir(cwd)
        status = cli.main(["check", "kernels.py:no_default_scale", *UNSCALED_FLAGS, *files])
    return CheckRun(status, out.getvalue(), err.getvalue(), cwd, reports)
