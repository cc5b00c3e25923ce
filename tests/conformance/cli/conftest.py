"""The kernels the tests of the ``attnspec`` command check (a file in ``tmp_path``), and the
report files they ask for."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import KERNELS, kernel_file


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    return kernel_file(tmp_path, "kernels.py", KERNELS)


@pytest.fixture
def report_files(tmp_path: Path) -> tuple[dict[str, Path], tuple[str, ...]]:
    """Where a check's JSON, JUnit and Markdown reports go in ``tmp_path`` (by kind), and
    the --json, --junit and --markdown flags that ask for them there."""
    paths = {kind: tmp_path / f"report.{kind}" for kind in ("json", "junit", "markdown")}
    return paths, tuple(a for kind, path in paths.items() for a in (f"--{kind}", str(path)))
