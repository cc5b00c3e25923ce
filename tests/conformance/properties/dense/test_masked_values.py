"""SDPA-8.1 holds under SDPA-7.4's precondition, and masked-values-ignored draws within it.

The precondition: every scaled score, bias value and their sum is finite in the accumulation
precision.  Outside it a kernel that computes an excluded score before discarding it may
overflow to inf and produce NaN (inf - inf); inside it, up to its largest values, a correct
kernel is unaffected and a kernel that masks with a large finite number is caught.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from catalogue.buggy import CATALOGUE
from support import verdict_of

import attnspec
from attnspec.backends import Backend
from attnspec.conformance import Problem, declare
from attnspec.conformance.judge.properties import masked_values
from attnspec.conformance.judge.properties.masked_values import (
    ACCUMULATION_LARGEST,
    scores_within_precondition,
)
from attnspec.conformance.judge.verdict import FAILED, PASSED

NUMPY = Backend("numpy")


# A failure is not shrunk (shrink=False): the first failing example decides the status,
# and only the status is asserted here.
def test_outside_the_precondition_pytorch_returns_nan() -> None:
    """SDPA-8.1, SDPA-7.4: q = [10, -10], allowed key [1, 1], masked key [1e38, 0], V = I in
    float32: the masked score overflows, PyTorch returns NaN and the definition [1, 0]; the
    problem is outside the precondition, so SDPA-8.1 does not apply to it."""
    torch = pytest.importorskip("torch", reason="the example is PyTorch's behaviour")
    q = np.array([[[10.0, -10.0]]])
    k = np.array([[[1.0, 1.0], [1e38, 0.0]]])
    v = np.eye(2)[None]
    mask = np.array([[[True, False]]])
    as_torch = [torch.tensor(a, dtype=torch.float32) for a in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*as_torch, attn_mask=torch.tensor(mask))
    assert torch.isnan(out).all()
    assert np.array_equal(attnspec.scaled_dot_product_attention(q, k, v, mask=mask), [[[1, 0]]])
    assert not scores_within_precondition(Problem(q=q, k=k, v=v, dtype="float32", mask=mask))
    assert scores_within_precondition(Problem(q=q, k=k / 100, v=v, dtype="float32", mask=mask))


def recording(fn: Any, seen: list[Problem], dtypes: tuple[str, ...]) -> Any:
    """``fn`` declared with a mask and ``dtypes``, recording each call's inputs as a Problem."""

    def kernel(
        q: Any, k: Any, v: Any, *, mask: Any = None, is_causal: bool = False, scale: Any = None
    ) -> Any:
        arrays = [np.asarray(a, dtype=np.float64) for a in (q, k, v)]
        seen.append(Problem(*arrays, dtype=str(q.dtype), mask=mask, scale=scale))
        return fn(q, k, v, mask=mask, is_causal=is_causal, scale=scale)

    return declare(kernel, dtypes=dtypes)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_draws_reach_the_largest_values_the_precondition_allows(dtype: str) -> None:
    """SDPA-8.1: every problem the property gives the reference (quick profile) is within
    the precondition, and some carry masked keys whose scores reach at least 1/100 of the
    accumulation precision's largest number (or keys at 1/100 of float16's largest value,
    where the dtype binds first).  The quick profile's 70 calls per dtype reach them (the
    largest is one of the three new magnitudes drawn), and every larger profile runs its
    strata first (CONF-8), so the default and thorough ones reach them too."""
    seen: list[Problem] = []
    result = verdict_of(
        "masked-values-ignored",
        recording(attnspec.scaled_dot_product_attention, seen, (dtype,)),
        profile="quick",
        shrink=False,
    )
    assert result.status == PASSED, result.detail
    assert seen and all(scores_within_precondition(p) for p in seen)
    largest_key = max(float(np.max(np.abs(p.k), initial=0)) for p in seen)
    largest_score = max(float(np.max(masked_values.score_magnitudes(p), initial=0)) for p in seen)
    if dtype == "float16":
        assert largest_key >= 65504 / 100
    else:
        assert largest_score >= ACCUMULATION_LARGEST[dtype] / 100


def mask_with_minus_1e9(
    q: Any, k: Any, v: Any, *, mask: Any = None, is_causal: bool = False, scale: Any = None
) -> Any:
    """Masks by adding -1e9 to excluded scores (``masked_fill(-1e9)``), a common idiom: exact
    for scores of ordinary size, wrong once an excluded score exceeds about 1e9."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = scale * (q @ np.swapaxes(k, -1, -2))
    allowed = (
        np.ones(scores.shape, dtype=bool) if mask is None else np.broadcast_to(mask, scores.shape)
    )
    if is_causal:
        rows, cols = np.indices(scores.shape[-2:])
        allowed = allowed & (cols <= rows)
    scores = np.where(allowed, scores, scores - 1e9)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    out = (weights / weights.sum(axis=-1, keepdims=True)) @ v
    return np.where(allowed.any(axis=-1, keepdims=True), out, 0.0)  # SDPA-5.1 done right


def test_a_finite_mask_fill_is_caught_only_by_the_largest_values(monkeypatch) -> None:
    """SDPA-8.1: the -1e9 mask passes with masked values of magnitude 1 and 10 (what the
    property drew before), and fails once it draws the largest values the precondition
    allows, which make an excluded score dominate."""
    kernel = declare(mask_with_minus_1e9, dtypes=("float64",))
    assert verdict_of("masked-values-ignored", kernel, shrink=False).status == FAILED
    monkeypatch.setattr(masked_values, "NEW_MAGNITUDES", (1.0, 10.0))
    assert verdict_of("masked-values-ignored", kernel, shrink=False).status == PASSED


def test_a_bug_the_old_draws_caught_is_still_caught() -> None:
    """SDPA-8.1: the catalogue's max-includes-masked-keys (a row maximum taken over masked
    keys too), which the property caught before, still fails it."""
    bug = next(b for b in CATALOGUE if b.name == "max-includes-masked-keys")
    assert bug.catches == "masked-values-ignored"
    assert verdict_of("masked-values-ignored", bug.fn, shrink=False).status == FAILED
