"""The conformance suite on the MLA catalogue (tests/catalogue/mla.py): the correct kernel
passes, every catalogued bug fails the property that names it."""

from __future__ import annotations

import pytest
from support import assert_bug_caught, verdict_of

from attnspec.conformance.claims.declaration import declaration_of
from attnspec.conformance.judge.registry import all_properties
from catalogue import mla as catalogue
from catalogue.entry import CaughtBug


@pytest.mark.parametrize("fn", catalogue.CORRECT, ids=lambda fn: fn.__name__)
def test_correct_mla_kernel_passes(fn: object) -> None:
    """MLA-1, MLA-2, MLA-3 (and MLA-4, MLA-5 for the paged form): the absorbed form with the
    given scale, or FlashMLA's default, passes at E = 576, Ev = 512 in every NumPy dtype."""
    mla = declaration_of(fn).mla
    assert mla is not None
    name = "mla-paged-matches-reference" if mla.paged else "mla-matches-reference"
    verdict = verdict_of(name, fn, profile="quick")
    assert verdict.status == "passed", verdict.detail


@pytest.mark.parametrize("bug", catalogue.BUGS, ids=lambda bug: bug.fn.__name__)
def test_every_mla_bug_is_caught(bug: CaughtBug) -> None:
    """MLA-1, MLA-2, MLA-3: each catalogued bug fails the property that names it."""
    assert_bug_caught(bug)


def test_every_mla_property_has_a_bug() -> None:
    """MLA-3: the catalogue shows every MLA property failing on a bug."""
    assert {p for p in all_properties() if p.startswith("mla-")} == {
        bug.catches for bug in catalogue.BUGS
    }
