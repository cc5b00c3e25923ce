"""The judging worker's memory settings (issue 33, the cost of a check; no clause: they
change the machine's work, never a verdict).  Where they apply, a quick check of the NumPy
reference spent over half its CPU time in system time (page faults and huge-page
compaction) without them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from attnspec.conformance.run.worker import keep_freed_memory, no_huge_page_advice


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux's")
def test_the_judging_worker_keeps_freed_memory() -> None:
    """glibc takes each mallopt setting the judging worker asks for."""
    assert keep_freed_memory()


def test_huge_page_advice_is_off_unless_the_environment_sets_it() -> None:
    """NumPy's huge-page advice is switched off where NUMPY_MADVISE_HUGEPAGE is unset, and
    left as the user set it otherwise."""
    assert not no_huge_page_advice({"NUMPY_MADVISE_HUGEPAGE": "1"})
    assert no_huge_page_advice({})


def test_workers_share_the_runs_hypothesis_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker started inside a check's hypothesis_storage_elsewhere block is given that
    block's directory (Hypothesis's home there: one scan of the local source files for
    constants per run, not per worker); outside one, or where the user set
    HYPOTHESIS_STORAGE_DIRECTORY (which the worker inherits), nothing."""
    from hypothesis.configuration import storage_directory

    from attnspec.conformance.call.side_effects import (
        STORAGE_VARIABLE,
        hypothesis_storage_elsewhere,
        hypothesis_storage_variables,
    )

    monkeypatch.delenv(STORAGE_VARIABLE, raising=False)
    assert hypothesis_storage_variables() == {}
    with hypothesis_storage_elsewhere():
        variables = hypothesis_storage_variables()
        assert list(variables) == [STORAGE_VARIABLE]
        assert storage_directory("constants").home_directory == Path(variables[STORAGE_VARIABLE])
        monkeypatch.setenv(STORAGE_VARIABLE, "/chosen/by/the/user")
        assert hypothesis_storage_variables() == {}
        monkeypatch.delenv(STORAGE_VARIABLE)
    assert hypothesis_storage_variables() == {}
