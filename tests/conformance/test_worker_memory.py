"""The judging worker's memory settings (issue 33, the cost of a check; no clause: they
change the machine's work, never a verdict).  Where they apply, a quick check of the NumPy
reference spent over half its CPU time in system time (page faults and huge-page
compaction) without them."""

from __future__ import annotations

import sys

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
