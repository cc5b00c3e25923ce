"""Scale (SDPA-2.1, SDPA-2.2): each property passes on correct kernels and fails on a
realistic buggy one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from family_kernels import (
    assert_status,
)
from support import backend_or_skip, verdict_of

import attnspec
from attnspec.conformance import declare
from attnspec.conformance.judge.verdict import FAILED, PASSED


def reference_with_scale(choose: Callable[[int, int, float | None], float | None]) -> Any:
    def kernel(q, k, v, *, mask=None, is_causal=False, scale=None):
        chosen = choose(q.shape[-1], v.shape[-1], scale)
        return attnspec.scaled_dot_product_attention(
            q, k, v, mask=mask, is_causal=is_causal, scale=chosen
        )

    return declare(kernel, gqa=True)


def _default(head_dim: int) -> float:
    return 1 / math.sqrt(head_dim)


SCALE_BUGS = {
    "divides by E": lambda e, ev, s: 1 / e if s is None else s,
    "divides by sqrt(Ev)": lambda e, ev, s: 1 / math.sqrt(ev) if s is None else s,
    "no scale at all": lambda e, ev, s: 1.0 if s is None else s,
    "scale applied twice": lambda e, ev, s: (_default(e) if s is None else s) ** 2,
}


@pytest.mark.parametrize("property_id", ["default-scale", "explicit-scale", "score-variance"])
def test_scale_properties_pass_on_the_reference_and_torch(property_id: str) -> None:
    """SDPA-2.1, SDPA-2.2: the reference and PyTorch SDPA scale exactly as specified."""
    torch = pytest.importorskip("torch", reason="torch is an optional backend")
    assert_status(reference_with_scale(lambda e, ev, s: s), property_id, PASSED)
    assert_status(
        torch.nn.functional.scaled_dot_product_attention,
        property_id,
        PASSED,
        backend_or_skip("torch"),
    )


@pytest.mark.parametrize("bug", sorted(SCALE_BUGS))
@pytest.mark.parametrize("property_id", ["default-scale", "score-variance"])
def test_default_scale_bugs_are_caught(bug: str, property_id: str) -> None:
    """SDPA-2.1: 1/E, 1/sqrt(Ev), no scale and scale squared are all rejected."""
    assert_status(reference_with_scale(SCALE_BUGS[bug]), property_id, FAILED)


def test_an_ignored_explicit_scale_is_caught() -> None:
    """SDPA-2.2: a kernel that drops scale= fails explicit-scale but not default-scale."""
    ignores = reference_with_scale(lambda e, ev, s: None)
    assert_status(ignores, "explicit-scale", FAILED)
    assert_status(ignores, "default-scale", PASSED)
    detail = verdict_of("default-scale", reference_with_scale(SCALE_BUGS["divides by E"])).detail
    assert "looks like 1/E" in detail
