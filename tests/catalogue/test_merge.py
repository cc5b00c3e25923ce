"""The conformance suite on the merge catalogue (tests/catalogue/merge.py): the correct
formulations pass both merge properties, every catalogued bug fails the property that
names it, and every merge property has a bug."""

from __future__ import annotations

import pytest
from support import assert_bug_caught, assert_family_passes, family_verdicts

from attnspec.conformance.judge.registry import all_properties
from catalogue import merge as catalogue
from catalogue.entry import CaughtBug


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict[str, str]]:
    """The correct functions' verdicts per property (one quick check each)."""
    return family_verdicts(catalogue)


def test_correct_merges_conform(verdicts: dict[str, dict[str, str]]) -> None:
    """MERGE-1, MERGE-2, MERGE-3, MERGE-4: the correct formulations (FlashInfer's layouts
    and base 2 among them) pass both merge properties in every dtype NumPy has, and no
    attention property applies to them."""
    for fn in catalogue.CORRECT:
        assert_family_passes(verdicts[fn.__name__], "merge-", fn.__name__)


@pytest.mark.parametrize("bug", catalogue.BUGS, ids=lambda bug: bug.fn.__name__)
def test_every_merge_bug_is_caught(bug: CaughtBug) -> None:
    """MERGE-3, MERGE-4: each catalogued bug fails the property that names it on
    the quick profile (that property alone, in this process)."""
    assert_bug_caught(bug, seed=0)


def test_every_merge_property_has_a_bug() -> None:
    """MERGE-3, MERGE-4: the catalogue shows every merge property failing on a bug."""
    merge_properties = {p for p in all_properties() if p.startswith("merge-")}
    assert merge_properties == {bug.catches for bug in catalogue.BUGS}
