"""CONF-8's strata: a realistic stratum of one example keeps its simplest sizes, but draws
everything else from a seeded source (conformance/one_example.py); anchors keep
Hypothesis's simplest draws."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support import recording, verdict_of

from attnspec.conformance.draw import sizes
from attnspec.conformance.draw.one_example import is_size_draw
from attnspec.conformance.judge.verdict import PASSED
from attnspec.conformance.run import property_runner as runner_module

Seen = list[tuple[str, tuple[int, ...], tuple[int, ...], str]]


def stratum_shapes_and_options(q: Any, k: Any, v: Any, **options: Any) -> Any:
    """Per call: the stratum, q's and k's shapes and what the call asked for (mask density,
    bias, causal, scale)."""
    mask = options["mask"]
    density = None if mask is None else round(float(np.mean(mask)), 2)
    asked = (
        f"mask={density} bias={options['bias'] is not None} "
        f"causal={options['is_causal']} scale={options['scale']}"
    )
    return sizes.current().stratum.name, q.shape, k.shape, asked


def calls(monkeypatch: pytest.MonkeyPatch, property_id: str, seeded: bool) -> Seen:
    seen: Seen = []
    if not seeded:
        monkeypatch.setattr(runner_module, "seeds_besides_sizes", lambda stratum, count: False)
    kernel = recording(seen, record=stratum_shapes_and_options, mask=True, causal=True, scale=True)
    assert verdict_of(property_id, kernel).status == PASSED
    monkeypatch.undo()
    return seen


# matches-reference draws its sizes through draw_dims alone; causal-alignment changes them
# (Lk != Lq, label "Lk - Lq") where a drawn shape has Lq == Lk
@pytest.mark.parametrize("property_id", ["matches-reference", "causal-alignment"])
def test_one_example_strata_keep_their_sizes_and_vary_the_rest(
    monkeypatch: pytest.MonkeyPatch, property_id: str
) -> None:
    """CONF-8: the decode, wide-head and combination strata of the quick profile meet the
    same (q, k) shapes as Hypothesis's simplest example gives, and more than its options:
    a mask that is not all True, a bias or an explicit scale where it drew none (for a
    property that draws them); the anchors meet the same problems either way; the seeded
    draws repeat run to run."""
    simplest = calls(monkeypatch, property_id, False)
    seeded = calls(monkeypatch, property_id, True)
    assert seeded == calls(monkeypatch, property_id, True)

    def by_stratum(seen: Seen, anchors: bool) -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = {}
        for stratum, q, k, asked in seen:
            if stratum.startswith("anchor") == anchors and stratum != "small":
                found.setdefault(stratum, []).append((q, k, asked))
        return found

    one_example = [
        s.name
        for s in runner_module.PROFILES["quick"].strata(sizes.SizeLimits())
        if s.realistic and s.examples == 1 and s.anchor is None
    ]
    before, after = by_stratum(simplest, False), by_stratum(seeded, False)
    assert set(one_example) <= set(before) and set(one_example) <= set(after)
    for name in one_example:
        assert [(q, k) for q, k, _ in before[name]] == [(q, k) for q, k, _ in after[name]]
    if property_id == "matches-reference":  # it draws every option (causal-alignment forces)
        changed = [
            n for n in one_example if [a for *_, a in before[n]] != [a for *_, a in after[n]]
        ]
        assert len(changed) >= len(one_example) - 1, (changed, one_example)
    assert by_stratum(simplest, True) == by_stratum(seeded, True)


@pytest.mark.parametrize(
    ("label", "size"),
    [
        ("Lk", True),
        ("Lk - Lq", True),
        ("shape (pooled)", True),
        ("batch 0", True),
        ("mask kind", False),
        (None, False),
    ],
)
def test_size_draws_are_told_apart_by_label(label: str | None, size: bool) -> None:
    """The draws left to Hypothesis are those that choose sizes."""
    assert is_size_draw(label) is size
