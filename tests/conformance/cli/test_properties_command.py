"""``attnspec properties``: every property, in the spec's clause order (CONF-1)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import run_main

from attnspec.conformance.judge.registry import all_properties


def test_properties_lists_every_property(capsys: pytest.CaptureFixture[str]) -> None:
    """``attnspec properties``: every registered id with its clause and level."""
    status, out, _ = run_main(capsys, "properties")
    assert status == 0
    lines = {line.split()[0]: line.split() for line in out.splitlines()[1:] if line.strip()}
    for prop in all_properties().values():
        assert lines[prop.id][1:3] == [prop.clause, prop.level]


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    """``attnspec properties | head -1`` (CONF-1's list, read in part): the command stops
    quietly with exit status 2 (docs/checking-your-kernel.md, section 5), not with attnspec's
    "internal error" and a BrokenPipeError traceback.  The reader is gone before the first
    line (the list fits in a pipe's buffer, so a reader that leaves after one line may find
    it all written: no error to provoke)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "attnspec.conformance.cli", "properties"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr == "", done.stderr
    assert done.returncode == 2, done.returncode
