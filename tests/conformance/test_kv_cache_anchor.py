"""SINK-4, KVCACHE-6: the KV-cache properties run a fixed StreamingLLM call.

Sink tokens matter where the window has moved past them; a drawn cache reaches that only
by chance, and which examples Hypothesis draws depends on more than the seed (it mixes in
constants of the modules a process has imported), so a catch left to the random strata
hangs on what else ran in the process.  The anchor of ``anchors.KV_CACHE_ANCHORS`` passes
sink tokens beside a short window on every seed and profile, wherever the kernel takes
both.  The calls are drawn here as the properties draw them.
"""

from __future__ import annotations

import numpy as np
import pytest
from catalogue import packed_kernels
from hypothesis import given, settings
from hypothesis import strategies as st
from support import backend_or_skip

from attnspec.conformance.draw import sizes
from attnspec.conformance.draw.anchors import (
    ANCHORS,
    KV_CACHE_ANCHORS,
    anchor_applies,
    anchor_options,
)
from attnspec.conformance.judge.failures import PropertyFailure
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.packed_calls import Batch
from attnspec.conformance.judge.properties.varlen_kv_cache import draw_cache_batch
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.run.property_runner import ANCHOR_COST, PROFILES
from attnspec.reference.serving.paged import Rules

ANCHOR = KV_CACHE_ANCHORS[0]
STRATUM = sizes.Stratum(
    f"anchor: {ANCHOR.name}", 1, ANCHOR_COST, anchor_options(ANCHOR, None), anchor=ANCHOR
)


def _kernel(fn: object) -> KernelUnderTest:
    return KernelUnderTest(fn, backend_or_skip("numpy"))  # type: ignore[arg-type]


def _each_anchor_call(fn: object, check: object, examples: int) -> None:
    """``check(kernel, data)`` on ``examples`` calls of the anchor's stratum (the first
    Hypothesis's simplest, as a profile runs it; the others with other drawn options)."""
    kernel = _kernel(fn)

    @settings(max_examples=examples, database=None, derandomize=True, deadline=None)
    @given(st.data())
    def run(data: st.DataObject) -> None:
        check(kernel, data)  # type: ignore[operator]

    with sizes.drawing(STRATUM):
        run()


def test_kv_cache_properties_run_the_anchor_where_the_kernel_takes_its_options() -> None:
    """SINK-4, KVCACHE-6: every property that draws a KV-cache call runs the KV-cache
    anchors after the dense ones, in every profile; a kernel that takes neither a window
    nor sink tokens skips them."""
    drawing = {p.id for p in all_properties().values() if p.draws == "kv-cache"}
    assert drawing == {
        "kv-cache-matches-reference",
        "kv-cache-stale-positions",
        "kv-cache-nan-past-length",
        "kv-cache-append",
        "kv-cache-paged",
    }
    cache = [f"anchor: {a.name}" for a in KV_CACHE_ANCHORS]
    for name, profile in PROFILES.items():
        dense = [s.name for s in profile.strata(sizes.SizeLimits())]
        drawn = [s.name for s in profile.strata(sizes.SizeLimits(), "kv-cache")]
        # the small stratum, then the dense anchors (some once per dtype)
        after = 1 + sum(n.startswith("anchor: ") for n in dense)
        assert after > len(ANCHORS), name
        assert drawn == [*dense[:after], *cache, *dense[after:]], name
    assert anchor_applies(ANCHOR, ("leftpad", "window", "chunk", "sink_tokens"))
    assert not anchor_applies(ANCHOR, ("leftpad", "window"))
    assert anchor_applies(None, ())  # a random stratum runs for every kernel


def test_anchor_call_has_sink_tokens_past_a_short_window() -> None:
    """SINK-4, KVCACHE-6: the anchor's call has 3 batch elements of other lengths and
    left paddings, GQA, and 4 sink tokens beside a window of (16, 0), which has moved
    past them in the first and last elements (so they add keys there) and still covers
    them in the second."""
    batches: list[Batch] = []
    _each_anchor_call(
        packed_kernels.kv_cache_in_place,
        lambda kernel, data: batches.append(draw_cache_batch(data, kernel)),
        2,
    )
    for batch in batches:
        cache = batch.kv_cache
        assert (cache.window, cache.sink_tokens) == ((16, 0), 4), cache.describe()
        assert cache.starts == [0, 5, 64] and cache.lengths == [300, 17, 129]
        assert batch.first.q.shape[-3] == 3 * batch.first.k.shape[-3]  # GQA, 3 groups
        spared = []
        for s in batch.sequences:
            n_q, n_k = s.q.shape[-2], s.k.shape[-2]
            t = np.arange(n_q)[:, None] + (n_k - n_q)
            window = np.asarray(Rules(s.is_causal, 16, 0, None).allowed(np, t, np.arange(n_k)))
            assert s.mask is not None and not np.any(window & ~s.mask)
            spared.append(int(np.sum(s.mask & ~window)))
        sinks_per_query = 4 * ANCHOR.n_queries
        assert spared == [sinks_per_query, 0, sinks_per_query], spared


@pytest.mark.parametrize(
    ("fn", "caught"),
    [
        (packed_kernels.kv_cache_sink_tokens_windowed, True),
        (packed_kernels.kv_cache_in_place, False),
        (packed_kernels.kv_cache_contiguous, False),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_anchor_alone_catches_a_window_that_hides_the_sink_tokens(fn: object, caught: bool) -> None:
    """SINK-4, KVCACHE-2: on every call of the anchor (its other options drawn),
    kv-cache-matches-reference fails the catalogue kernel whose window hides the sink
    tokens and passes the correct paged and contiguous kernels."""
    check = all_properties()["kv-cache-matches-reference"].check

    def judged(kernel: KernelUnderTest, data: st.DataObject) -> None:
        try:
            check(kernel, data)
        except PropertyFailure as failure:
            assert caught, failure.finding
        else:
            assert not caught, "the anchor's call passed"

    _each_anchor_call(fn, judged, 2)
