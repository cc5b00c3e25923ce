"""The conformance suite on the merge catalogue (tests/catalogue/merge.py): the correct
formulations pass both merge properties, every catalogued bug fails the property that
names it, and every merge property has a bug."""

from __future__ import annotations

import pytest

from attnspec.conformance import check
from attnspec.conformance.judge.registry import all_properties
from catalogue import merge as catalogue


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict[str, str]]:
    """One quick-profile check of every catalogue function on NumPy: its verdict per
    property."""
    results = {}
    for fn in (*catalogue.CORRECT, *(bug.fn for bug in catalogue.BUGS)):
        report = check(fn, backend="numpy", profile="quick", seed=0)
        results[fn.__name__] = {v.property: v.status for v in report.verdicts}
    return results


def test_correct_merges_conform(verdicts: dict[str, dict[str, str]]) -> None:
    """MERGE-1, MERGE-2, MERGE-3, MERGE-4: the correct formulations (FlashInfer's layouts
    and base 2 among them) pass both merge properties in every dtype NumPy has, and no
    attention property applies to them."""
    for fn in catalogue.CORRECT:
        statuses = verdicts[fn.__name__]
        assert statuses["merge-matches-reference"] == "passed", fn.__name__
        assert statuses["merge-empty-states"] == "passed", fn.__name__
        others = {s for p, s in statuses.items() if not p.startswith("merge-")}
        assert others == {"not applicable"}, (fn.__name__, others)


@pytest.mark.parametrize("bug", catalogue.BUGS, ids=lambda bug: bug.fn.__name__)
def test_every_merge_bug_is_caught(
    bug: catalogue.MergeBug, verdicts: dict[str, dict[str, str]]
) -> None:
    """MERGE-3, MERGE-4: each catalogued bug fails the property that names it."""
    assert verdicts[bug.fn.__name__][bug.catches] == "failed"


def test_every_merge_property_has_a_bug() -> None:
    """MERGE-3, MERGE-4: the catalogue shows every merge property failing on a bug."""
    merge_properties = {p for p in all_properties() if p.startswith("merge-")}
    assert merge_properties == {bug.catches for bug in catalogue.BUGS}
