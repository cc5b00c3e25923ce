"""The conformance suite on the merge, paged-batch and RoPE catalogues
(tests/catalogue/merge.py, paged_batch.py, rope.py): in each family the correct
formulations pass every property of the family, every catalogued bug fails the property
that names it, and every property of the family has a bug."""

from __future__ import annotations

import sys
from types import ModuleType

import numpy as np
import pytest
from support import (
    assert_bug_caught,
    assert_family_passes,
    backend_or_skip,
    family_verdicts,
    verdict_of,
)

from attnspec.conformance.judge.call_guard import guard_calls
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import FAILED
from catalogue import merge, paged_batch, rope
from catalogue.entry import CaughtBug

# each family's catalogue and the prefix of its properties' ids
FAMILIES: dict[str, tuple[ModuleType, str]] = {
    "merge": (merge, "merge-"),
    "paged-batch": (paged_batch, "paged-batch-"),
    "rope": (rope, "rope-"),
}
BUGS = [bug for catalogue, _ in FAMILIES.values() for bug in catalogue.BUGS]


@pytest.mark.parametrize("family", FAMILIES)
def test_correct_formulations_conform(family: str) -> None:
    """MERGE-1, MERGE-2, MERGE-3, MERGE-4, PAGED-2, PAGED-5, PAGED-7, ROPE-1, ROPE-3: the
    correct formulations (FlashInfer's merge layouts and base 2, vLLM's page layout and the
    three RoPE layouts among them) pass every property of their family in every dtype NumPy
    has (one quick check each), and no other property applies to them."""
    catalogue, prefix = FAMILIES[family]
    verdicts = family_verdicts(catalogue)
    for fn in catalogue.CORRECT:
        assert_family_passes(verdicts[fn.__name__], prefix, fn.__name__)


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: bug.fn.__name__)
def test_every_bug_is_caught(bug: CaughtBug) -> None:
    """MERGE-3, MERGE-4, PAGED-5, PAGED-7, PAGED-8, ROPE-1, ROPE-3: each catalogued bug
    fails the property that names it on the quick profile (that property alone, in this
    process)."""
    assert_bug_caught(bug, seed=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_property_has_a_bug(family: str) -> None:
    """MERGE-3, MERGE-4, PAGED-5, PAGED-7, ROPE-1, ROPE-3: each catalogue shows every
    property of its family failing on a realistic bug."""
    catalogue, prefix = FAMILIES[family]
    properties = {p for p in all_properties() if p.startswith(prefix)}
    assert properties == {bug.catches for bug in catalogue.BUGS}


def test_a_crash_on_malformed_paged_metadata_fails() -> None:
    """PAGED-6, CONF-5: a paged kernel that ends the process on a page index past the pool,
    instead of raising, has not rejected it: the SHOULD property fails (CONF-5 is a MUST
    whatever the property's level) where a kernel returning a result only warns."""

    @paged_batch.paged_kernel()
    def exits_on_bad_page(call: paged_batch.PagedCall) -> np.ndarray:
        if (np.asarray(call.block_table) >= call.k_cache.shape[0]).any():
            sys.exit(0)
        return np.zeros(call.q.shape[:2] + call.v_cache.shape[-1:], call.q.dtype)

    kernel = KernelUnderTest(exits_on_bad_page, backend_or_skip("numpy"))
    guard_calls(kernel)
    verdict = verdict_of("paged-batch-rejects-malformed", kernel, seed=0)
    assert (verdict.level, verdict.status) == ("SHOULD", FAILED), verdict.detail
    assert "CONF-5" in verdict.detail and "sys.exit(0)" in verdict.detail, verdict.detail
