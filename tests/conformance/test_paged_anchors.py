"""PAGED-1, PAGED-4, PAGED-7: the paged-batch properties draw the sizes serving stacks run.

Their anchors (``anchors.PAGED_ANCHORS``, run in every profile in place of the dense ones)
read pools of more than 2**15 positions at page sizes 1, 16, 64 and 256, where a 16-bit
slot or page index wraps (the catalogue's ``paged_slot_index_int16`` is caught there,
tests/catalogue/test_serving_families.py), and a batch with a prefill of a thousand
queries beside decode rows; their mixed-batch stratum puts a prefill of up to about 2000
queries beside decode rows and short chunks in one batch.  The batches are drawn here
without calling a kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from catalogue.paged_batch import PagedCall, paged_kernel
from hypothesis import given, settings
from hypothesis import strategies as st
from support import backend_or_skip

from attnspec.conformance.draw import sizes
from attnspec.conformance.draw.anchors import (
    PAGED_ANCHORS,
    PAGED_POOL_SLOTS,
    anchor_options,
)
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.properties.paged_batch import _draw_call
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.run.property_runner import ANCHOR_COST, LONG_COST, PROFILES


@paged_kernel()
def zeros(call: PagedCall) -> np.ndarray:
    """Draws only: the properties' batches are drawn here, never passed to it."""
    return np.zeros(call.q.shape[:2] + call.v_cache.shape[-1:], call.q.dtype)


def _drawn(stratum: sizes.Stratum, examples: int) -> list[Any]:
    """``examples`` batches the paged-batch properties draw in ``stratum`` for a kernel
    with PAGED-1's metadata alone."""
    kernel = KernelUnderTest(zeros, backend_or_skip("numpy"))
    calls: list[Any] = []

    @settings(max_examples=examples, database=None, derandomize=True, deadline=None)
    @given(st.data())
    def draw(data: st.DataObject) -> None:
        calls.append(_draw_call(data, kernel))

    with sizes.drawing(stratum):
        draw()
    return calls


def test_paged_properties_run_their_anchors_and_the_mixed_stratum() -> None:
    """PAGED-4, PAGED-7: in every profile the paged-batch properties that draw batches run
    the paged anchors after the small problems and a mixed-batch stratum; no other
    property runs either."""
    drawing = {p.id for p in all_properties().values() if p.draws == "paged-batch"}
    assert drawing == {"paged-batch-matches-reference", "paged-batch-ignores-padding"}
    for name, profile in PROFILES.items():
        paged = [s.name for s in profile.strata(sizes.SizeLimits(), "paged-batch")]
        dense = [s.name for s in profile.strata(sizes.SizeLimits())]
        anchors = [f"anchor: {a.name}" for a in PAGED_ANCHORS]
        assert paged[1 : 1 + len(anchors)] == anchors, name
        assert "mixed batch" in paged and "mixed batch" not in dense, name
        assert not set(anchors) & set(dense), name


def test_anchor_batches_read_past_2_15_slots_of_modest_pools() -> None:
    """PAGED-1, PAGED-4: each page size 1, 16, 64 and 256 has an anchor whose sequences
    read slots past 2**15 (page indices too, with pages of 1) of a pool of at most 2**20
    values per cache, through block table rows as wide as the pool; one anchor holds a
    prefill of a thousand queries beside decode rows."""
    page_sizes = set()
    for anchor in PAGED_ANCHORS:
        stratum = sizes.Stratum(
            f"anchor: {anchor.name}", 1, ANCHOR_COST, anchor_options(anchor, None), anchor=anchor
        )
        (call,) = _drawn(stratum, 1)
        assert call.k_cache.size <= 2**20, (anchor.name, call.k_cache.shape)
        assert call.table.shape[1] == call.k_cache.shape[0], anchor.name
        if anchor.pool_slots:
            page_sizes.add(call.page_size)
            slots = [
                int(call.table[b, t // call.page_size]) * call.page_size + t % call.page_size
                for b, n in enumerate(call.n_keys)
                for t in range(n)
            ]
            assert call.k_cache.shape[0] * call.page_size >= PAGED_POOL_SLOTS, anchor.name
            assert max(slots) >= 2**15 and min(slots) < 2**15, anchor.name
        else:
            assert max(call.n_queries) >= 1000 and call.n_queries.count(1) >= 2, anchor.name
    assert page_sizes == {1, 16, 64, 256}


def test_mixed_batches_hold_decode_rows_and_long_prefills() -> None:
    """PAGED-2, PAGED-7: every batch of the mixed-batch stratum holds a decode row and a
    prefill of at least 129 queries among 3 to 6 sequences, and its draws reach prefills
    of a thousand queries and more."""
    stratum = sizes.Stratum("mixed batch", 5, LONG_COST, (("shape", "mixed"),))
    calls = _drawn(stratum, 5)
    for call in calls:
        assert 3 <= len(call.n_queries) <= 6, call.describe()
        assert min(call.n_queries) == 1 and max(call.n_queries) >= 129, call.describe()
    assert max(max(call.n_queries) for call in calls) >= 1000
    assert len({tuple(np.sort(call.n_queries)) for call in calls}) > 1
