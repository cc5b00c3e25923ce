"""The conformance suite on the recurrence catalogue (tests/catalogue/recurrent.py): the
two correct formulations pass ``recurrent-matches-reference`` in the quick profile and
every catalogued bug fails it (issue 37)."""

from __future__ import annotations

import pytest

from attnspec.conformance import check
from catalogue import recurrent as catalogue


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict[str, str]]:
    """One quick-profile check of every declared catalogue kernel on NumPy."""
    results = {}
    for fn in (*catalogue.DECLARED_CORRECT, *catalogue.DECLARED_BUGS):
        report = check(fn, backend="numpy", profile="quick", seed=0)
        results[fn.__name__] = {v.property: v.status for v in report.verdicts}
    return results


def test_correct_recurrences_conform(verdicts: dict[str, dict[str, str]]) -> None:
    """REC-6.2: the token recurrence and the chunked form pass; no other property applies."""
    for fn in catalogue.DECLARED_CORRECT:
        statuses = verdicts[fn.__name__]
        assert statuses["recurrent-matches-reference"] == "passed", (fn.__name__, statuses)
        others = {s for p, s in statuses.items() if not p.startswith("recurrent-")}
        assert others == {"not applicable"}, (fn.__name__, others)


@pytest.mark.parametrize("name", [fn.__name__ for fn in catalogue.DECLARED_BUGS])
def test_every_recurrence_bug_is_caught(name: str, verdicts: dict[str, dict[str, str]]) -> None:
    """REC-6.2 (REC-1.2, REC-1.5, REC-2.2, REC-2.3, REC-3.1, REC-4.1, REC-5.1, REC-5.2): each
    catalogued bug fails the quick profile."""
    assert verdicts[name]["recurrent-matches-reference"] == "failed"
