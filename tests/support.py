"""Helpers shared by the test modules (fixtures built on them live in conftest.py).

Plain functions, importable as ``support`` (``tests/`` is on ``pythonpath``): a conftest
module cannot be imported by name under ``--import-mode=importlib``.
"""

from __future__ import annotations

from hypothesis import settings

# The project's own Hypothesis tests: the same examples on every run (derandomize), no
# database (nothing learned in one run changes the next), no deadline (timings on a shared
# 2-core machine are not the property under test).  Each test states its example count.
DRAWN = settings(derandomize=True, database=None, deadline=None, print_blob=False)


def drawn(max_examples: int) -> settings:
    """:data:`DRAWN` with a bounded number of generated examples (explicit ones run too)."""
    return settings(DRAWN, max_examples=max_examples)
