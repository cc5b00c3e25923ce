"""``pytest --clause ID``: the tests of one spec clause, wherever they live.

Tests are laid out by layer (tests/reference, tests/conformance/properties/<spec document>,
tests/catalogue), and every test cites the clauses it checks: in its docstring or name, its
class's or module's docstring, or a parameter's id.  Selecting by that citation leads from a
clause id to all of its tests at once: ``pytest --clause SDPA-4.2`` runs them,
``--collect-only -q`` lists them, and a section id (``--clause SDPA-4``) takes its
clauses too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import pytest

from attnspec.conformance.claims.clauses import all_clauses


def cites(text: str, clause_id: str) -> bool:
    """Whether ``text`` cites ``clause_id`` or one of the clauses under it: ``SDPA-4``
    matches ``SDPA-4`` and ``SDPA-4.2``, never a longer number that starts with its digits."""
    return re.search(rf"(?<![A-Za-z0-9-]){re.escape(clause_id)}(?![0-9])", text) is not None


def known_clause_ids(wanted: Iterable[str]) -> list[str]:
    """``wanted``, each checked to be a clause of spec/*.md or a section above clauses;
    else a usage error that names the argument and what it should be."""
    known = all_clauses()
    for clause_id in wanted:
        if clause_id not in known and not any(k.startswith(clause_id + ".") for k in known):
            raise pytest.UsageError(
                f"--clause {clause_id!r}: no clause or section with that id in spec/*.md "
                "(expected an id such as SDPA-4.2 or SDPA-4)"
            )
    return list(wanted)


def citations_of(item: pytest.Item) -> str:
    """What a test cites: its name with parameter ids and the docstrings of its function,
    class and module."""
    parts = [item.name]
    for owner in (getattr(item, "function", None), getattr(item, "cls", None)):
        parts.append(getattr(owner, "__doc__", None) or "")
    module = getattr(item, "module", None)
    parts.append(getattr(module, "__doc__", None) or "")
    return "\n".join(parts)


def select_by_clause(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the collected tests that cite one of ``--clause``'s ids (none given: all)."""
    wanted = config.getoption("clause")
    if not wanted:
        return
    clause_ids = known_clause_ids(wanted)
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        text = citations_of(item)
        (kept if any(cites(text, c) for c in clause_ids) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept
