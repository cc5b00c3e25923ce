"""The conformance suite on the sink catalogue (tests/catalogue/sinks.py): the correct
formulations pass both sink properties, every catalogued bug fails the property that names
it, and every sink property has a bug; the same for sink tokens beside a window (SINK-4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support import SMALL_LIMITS, assert_bug_caught, verdict_of

from attnspec.conformance import declaration_of
from attnspec.conformance.judge.registry import all_properties
from catalogue import sinks as catalogue
from catalogue.entry import CaughtBug

SINK_PROPERTIES = ("sinks-matches-reference", "sinks-empty-rows", "sinks-lse")
TOKEN_PROPERTY = "sink-tokens-matches-reference"


@pytest.mark.parametrize("fn", catalogue.CORRECT, ids=lambda fn: fn.__name__)
@pytest.mark.parametrize("property_id", SINK_PROPERTIES)
def test_correct_sink_kernels_pass(fn: Callable[..., Any], property_id: str) -> None:
    """SINK-1, SINK-2, SINK-3, SINK-5: the correct formulations (Hugging Face's concatenated
    column, FlashAttention 4's denominator term, with and without the log-sum-exp) pass
    every sink property they claim in every NumPy dtype (sinks-lse needs returns_lse)."""
    declaration = declaration_of(fn)
    verdict = verdict_of(property_id, fn, declaration=declaration, profile="quick")
    wanted = (
        "not applicable" if property_id == "sinks-lse" and not declaration.returns_lse else "passed"
    )
    assert verdict.status == wanted, (property_id, verdict.detail)


@pytest.mark.parametrize("bug", catalogue.BUGS, ids=lambda bug: bug.fn.__name__)
def test_every_sink_bug_is_caught(bug: CaughtBug) -> None:
    """SINK-1, SINK-2, SINK-5: each catalogued bug fails the property that names it."""
    assert_bug_caught(bug)


def test_every_sink_property_has_a_bug() -> None:
    """SINK-2 … SINK-5: the catalogue shows every sink property failing on a bug."""
    assert set(SINK_PROPERTIES) == {p for p in all_properties() if p.startswith("sinks-")}
    assert set(SINK_PROPERTIES) == {bug.catches for bug in catalogue.BUGS}
    tokens = {p for p in all_properties() if p.startswith("sink-tokens-")}
    assert tokens == {bug.catches for bug in catalogue.TOKEN_BUGS} == {TOKEN_PROPERTY}


@pytest.mark.parametrize("fn", catalogue.TOKEN_CORRECT, ids=lambda fn: fn.__name__)
def test_correct_sink_token_kernel_passes(fn: Callable[..., Any]) -> None:
    """SINK-4: StreamingLLM's mask (the first n keys and the window up to the query, each
    once) passes sink-tokens-matches-reference, on problems cut to small sizes (the
    pattern's rows, not their length, are what it reads)."""
    verdict = verdict_of(
        TOKEN_PROPERTY, fn, declaration=declaration_of(fn), profile="quick", limits=SMALL_LIMITS
    )
    assert verdict.status == "passed", verdict.detail


@pytest.mark.parametrize("bug", catalogue.TOKEN_BUGS, ids=lambda bug: bug.fn.__name__)
def test_every_sink_token_bug_is_caught(bug: CaughtBug) -> None:
    """SINK-4: sink tokens counted twice where the window covers them, or dropped once the
    window has moved past them, fail sink-tokens-matches-reference on quick."""
    assert_bug_caught(bug)
