"""The runner's bytes choices (conformance/run/quick_bytes.py) are Hypothesis's own."""

from __future__ import annotations

from random import Random
from typing import Any

import pytest
from hypothesis.internal.conjecture.data import ConjectureData
from hypothesis.internal.conjecture.providers import HypothesisProvider

from attnspec.conformance.run import quick_bytes
from attnspec.conformance.run.hypothesis_constants import no_local_constants

OWN = HypothesisProvider.draw_bytes


def _draws(method: Any, seed: int, sizes: list[tuple[int, int]]) -> tuple[list[bytes], Any]:
    random = Random(seed)
    data = ConjectureData(random=random)
    drawn = [method(data.provider, low, high) for low, high in sizes]
    data.freeze()
    return drawn, random.getstate()


def test_quick_bytes_draw_what_hypothesis_draws() -> None:
    """CONF-8: quick_draw_bytes returns the bytes HypothesisProvider.draw_bytes returns and
    leaves the provider's ``random`` as it does, choice after choice of one stream, for
    minimum and maximum sizes around the small stratum's (0 to 300 bytes, exact sizes
    included), so a run draws the same examples with it."""
    sizes_of = Random(2026)
    with no_local_constants():
        for seed in range(40):
            sizes = []
            for _ in range(12):
                low = sizes_of.choice([0, 1, 2, 5, 28, 64, 255, 256, sizes_of.randrange(300)])
                high = low if sizes_of.random() < 0.2 else sizes_of.randrange(low, 301)
                sizes.append((low, max(high, low)))
            assert _draws(quick_bytes.quick_draw_bytes, seed, sizes) == _draws(OWN, seed, sizes)


def test_quick_bytes_stand_in_only_while_a_run_runs() -> None:
    """CONF-8: on the installed Hypothesis the two agree, so quick_bytes() puts
    quick_draw_bytes in place while it is entered (a property run's Hypothesis runs), and
    Hypothesis's own method is back once it is left."""
    assert quick_bytes.agrees_with_hypothesis()
    with quick_bytes.quick_bytes():
        assert HypothesisProvider.draw_bytes is quick_bytes.quick_draw_bytes
    assert HypothesisProvider.draw_bytes is OWN


def test_bytes_drawn_otherwise_keep_hypothesis_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """CONF-8: where the quick method draws other bytes than the installed Hypothesis (here
    one byte short; in general a Hypothesis that draws bytes otherwise), the check says so
    and runs keep Hypothesis's own method: the same examples, slower."""
    quick = quick_bytes.quick_draw_bytes

    def one_short(self: Any, min_size: int = 0, max_size: int = 8 * 1024) -> bytes:
        drawn = quick(self, min_size, max_size)
        return drawn[:-1] if len(drawn) > min_size else drawn

    monkeypatch.setattr(quick_bytes, "quick_draw_bytes", one_short)
    quick_bytes.agrees_with_hypothesis.cache_clear()
    try:
        assert not quick_bytes.agrees_with_hypothesis()
        with quick_bytes.quick_bytes():
            assert HypothesisProvider.draw_bytes is OWN
    finally:
        quick_bytes.agrees_with_hypothesis.cache_clear()
