"""The recurrence benchmark (``python -m attnspec.benchmarks.recurrent``) runs and its three
forms agree; it times nothing here (its numbers are in the closing notes of issue 37)."""

from __future__ import annotations

import pytest

from attnspec.benchmarks.recurrent import FORMS, main


def test_the_benchmark_runs_and_its_forms_agree(capsys: pytest.CaptureFixture[str]) -> None:
    """REC-5.1: the token recurrence, the slab-chunked form and the chunk-by-chunk form give
    the same float32 output (to float32 rounding) at a length that no chunk divides."""
    assert (
        main(["--lengths", "70", "--heads", "2", "--dim", "8", "--chunk", "16", "--repeat", "1"])
        == 0
    )
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[1] for row in rows] == list(FORMS)
    assert all(float(row[-1]) < 1e-5 for row in rows)
