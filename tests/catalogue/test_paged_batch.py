"""The conformance suite on the paged-batch catalogue (tests/catalogue/paged_batch.py): the
correct formulations pass both paged-batch properties, every catalogued bug fails the
property that names it, and every paged-batch property has a bug."""

from __future__ import annotations

import pytest
from support import assert_bug_caught, assert_family_passes, family_verdicts

from attnspec.conformance.judge.registry import all_properties
from catalogue import paged_batch as catalogue
from catalogue.entry import CaughtBug


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict[str, str]]:
    """The correct functions' verdicts per property (one quick check each)."""
    return family_verdicts(catalogue)


def test_correct_paged_kernels_conform(verdicts: dict[str, dict[str, str]]) -> None:
    """PAGED-2, PAGED-5, PAGED-7: the correct formulations (vLLM's page layout among them)
    pass both paged-batch properties in every dtype NumPy has, and no other property
    applies to them."""
    for fn in catalogue.CORRECT:
        assert_family_passes(verdicts[fn.__name__], "paged-batch-", fn.__name__)


@pytest.mark.parametrize("bug", catalogue.BUGS, ids=lambda bug: bug.fn.__name__)
def test_every_paged_batch_bug_is_caught(bug: CaughtBug) -> None:
    """PAGED-5, PAGED-7, PAGED-8: each catalogued bug fails the property that names it on
    the quick profile (that property alone, in this process)."""
    assert_bug_caught(bug, seed=0)


def test_every_paged_batch_property_has_a_bug() -> None:
    """PAGED-5, PAGED-7: the catalogue shows every paged-batch property failing on a bug."""
    paged_properties = {p for p in all_properties() if p.startswith("paged-batch-")}
    assert paged_properties == {bug.catches for bug in catalogue.BUGS}
