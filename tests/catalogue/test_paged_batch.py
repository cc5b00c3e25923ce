"""The conformance suite on the paged-batch catalogue (tests/catalogue/paged_batch.py): the
correct formulations pass both paged-batch properties, every catalogued bug fails the
property that names it, and every paged-batch property has a bug."""

from __future__ import annotations

import pytest

from attnspec.conformance import check
from attnspec.conformance.judge.registry import all_properties
from catalogue import paged_batch as catalogue


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict[str, str]]:
    """One quick-profile check of every catalogue function on NumPy: its verdict per
    property."""
    results = {}
    for fn in (*catalogue.CORRECT, *(bug.fn for bug in catalogue.BUGS)):
        report = check(fn, backend="numpy", profile="quick", seed=0)
        results[fn.__name__] = {v.property: v.status for v in report.verdicts}
    return results


def test_correct_paged_kernels_conform(verdicts: dict[str, dict[str, str]]) -> None:
    """PAGED-2, PAGED-5, PAGED-7: the correct formulations (vLLM's page layout among them)
    pass both paged-batch properties in every dtype NumPy has, and no other property
    applies to them."""
    for fn in catalogue.CORRECT:
        statuses = verdicts[fn.__name__]
        assert statuses["paged-batch-matches-reference"] == "passed", fn.__name__
        assert statuses["paged-batch-ignores-padding"] == "passed", fn.__name__
        others = {s for p, s in statuses.items() if not p.startswith("paged-batch-")}
        assert others == {"not applicable"}, (fn.__name__, others)


@pytest.mark.parametrize("bug", catalogue.BUGS, ids=lambda bug: bug.fn.__name__)
def test_every_paged_batch_bug_is_caught(
    bug: catalogue.PagedBug, verdicts: dict[str, dict[str, str]]
) -> None:
    """PAGED-5, PAGED-7: each catalogued bug fails the property that names it."""
    assert verdicts[bug.fn.__name__][bug.catches] == "failed"


def test_every_paged_batch_property_has_a_bug() -> None:
    """PAGED-5, PAGED-7: the catalogue shows every paged-batch property failing on a bug."""
    paged_properties = {p for p in all_properties() if p.startswith("paged-batch-")}
    assert paged_properties == {bug.catches for bug in catalogue.BUGS}
