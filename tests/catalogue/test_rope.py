"""The conformance suite on the RoPE catalogue (tests/catalogue/rope.py): the correct
formulations pass both RoPE properties (ROPE-1, ROPE-3), every catalogued bug fails the
property that names it, and every RoPE property has a bug."""

from __future__ import annotations

import pytest
from support import assert_bug_caught, assert_family_passes, family_verdicts

from attnspec.conformance.judge.registry import all_properties
from catalogue import rope as catalogue
from catalogue.entry import CaughtBug


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict[str, str]]:
    """The correct functions' verdicts per property (one quick check each)."""
    return family_verdicts(catalogue)


def test_correct_formulations_conform(verdicts: dict[str, dict[str, str]]) -> None:
    """ROPE-1, ROPE-3: the three correct formulations pass both RoPE properties in every
    dtype NumPy has, and no attention property applies to them."""
    for fn in catalogue.CORRECT:
        assert_family_passes(verdicts[fn.__name__], "rope-", fn.__name__)


@pytest.mark.parametrize("bug", catalogue.BUGS, ids=lambda bug: bug.fn.__name__)
def test_every_rope_bug_is_caught(bug: CaughtBug) -> None:
    """ROPE-1, ROPE-3: each catalogued bug fails the property that names it on
    the quick profile (that property alone, in this process)."""
    assert_bug_caught(bug, seed=0)


def test_every_rope_property_has_a_bug() -> None:
    """ROPE-1, ROPE-3: the catalogue shows every RoPE property failing on a realistic bug."""
    rope_properties = {p for p in all_properties() if p.startswith("rope-")}
    assert rope_properties == {bug.catches for bug in catalogue.BUGS}
