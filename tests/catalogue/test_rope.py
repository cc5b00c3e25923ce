"""The conformance suite on the RoPE catalogue (tests/catalogue/rope.py): the correct
formulations pass both RoPE properties (ROPE-1, ROPE-3), every catalogued bug fails the
property that names it, and every RoPE property has a bug."""

from __future__ import annotations

import pytest

from attnspec.conformance import check
from attnspec.conformance.judge.registry import all_properties
from catalogue import rope as catalogue


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict[str, str]]:
    """One quick-profile check of every catalogue function on NumPy: its verdict per
    property (about 0.6 s each)."""
    results = {}
    for fn in (*catalogue.CORRECT, *(bug.fn for bug in catalogue.BUGS)):
        report = check(fn, backend="numpy", profile="quick", seed=0)
        results[fn.__name__] = {v.property: v.status for v in report.verdicts}
    return results


def test_correct_formulations_conform(verdicts: dict[str, dict[str, str]]) -> None:
    """ROPE-1, ROPE-3: the three correct formulations pass both RoPE properties in every
    dtype NumPy has, and no attention property applies to them."""
    for fn in catalogue.CORRECT:
        statuses = verdicts[fn.__name__]
        assert statuses["rope-matches-reference"] == "passed", fn.__name__
        assert statuses["rope-shape-and-dtype"] == "passed", fn.__name__
        others = {s for p, s in statuses.items() if not p.startswith("rope-")}
        assert others == {"not applicable"}, (fn.__name__, others)


@pytest.mark.parametrize("bug", catalogue.BUGS, ids=lambda bug: bug.fn.__name__)
def test_every_rope_bug_is_caught(
    bug: catalogue.RopeBug, verdicts: dict[str, dict[str, str]]
) -> None:
    """ROPE-1, ROPE-3: each catalogued bug fails the property that names it."""
    assert verdicts[bug.fn.__name__][bug.catches] == "failed"


def test_every_rope_property_has_a_bug() -> None:
    """ROPE-1, ROPE-3: the catalogue shows every RoPE property failing on a realistic bug."""
    rope_properties = {p for p in all_properties() if p.startswith("rope-")}
    assert rope_properties == {bug.catches for bug in catalogue.BUGS}
