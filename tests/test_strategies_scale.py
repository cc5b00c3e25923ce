"""Realistic strata and value regimes (issue 7): the quick profile draws problems where real
kernels break, within the cost model and the user's caps, and shrinks to the smallest.

Four kernels below are exact on small problems and wrong only at realistic scale, as
tiled kernels go wrong: each is caught by the quick profile's ``matches-reference``
(SDPA-7.3) and, run on the small stratum alone, passes it.  Correct kernels pass the
realistic strata of every property, and PyTorch 2.13's ``is_causal`` with ``scale=0``
divergence (docs/divergences.md) is found by the quick profile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from catalogue.blocks import arrange, combine, finish, online_softmax, scores, softmax_lse
from catalogue.correct import lse_attention, online_softmax_attention

from attnspec.backends import Backend
from attnspec.conformance import declaration_of, declare
from attnspec.conformance.kernel import KernelUnderTest
from attnspec.conformance.registry import all_properties
from attnspec.conformance.runner import (
    FAILED,
    NOT_APPLICABLE,
    PASSED,
    PROFILES,
    Profile,
    run_property,
)
from attnspec.reference import scaled_dot_product_attention as reference_sdpa

Array = np.ndarray
BLOCK = 64


def _arranged(q: Array, k: Array, v: Array, mask: Array | None, bias: Array | None,
              is_causal: bool, scale: float | None) -> Any:
    return arrange(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale)


@declare(bias=True, gqa=True)
def tiled_without_rescale(q: Array, k: Array, v: Array, *, mask: Array | None = None,
                          bias: Array | None = None, is_causal: bool = False,
                          scale: float | None = None) -> Array:
    """Online softmax over blocks of 64 keys that forgets to rescale its accumulator and
    running sum when a later block raises the running max: exact up to 64 keys."""
    a = _arranged(q, k, v, mask, bias, is_causal, scale)
    s, allowed = scores(a)
    return finish(online_softmax(s, allowed, a.v, block=BLOCK, rescale=False), a)


@declare(bias=True, gqa=True)
def ragged_tail_dropped(q: Array, k: Array, v: Array, *, mask: Array | None = None,
                        bias: Array | None = None, is_causal: bool = False,
                        scale: float | None = None) -> Array:
    """Blocks of 64 keys whose ragged last block is skipped once there is more than one
    block: wrong only when Lk > 64 and Lk % 64 != 0."""
    a = _arranged(q, k, v, mask, bias, is_causal, scale)
    s, allowed = scores(a)
    single_block = s.shape[-1] <= BLOCK
    return finish(online_softmax(s, allowed, a.v, block=BLOCK, tail=single_block), a)


WIDEST_VECTOR_PATH = 128


@declare(bias=True, gqa=True)
def wide_head_dim_truncated(q: Array, k: Array, v: Array, *, mask: Array | None = None,
                            bias: Array | None = None, is_causal: bool = False,
                            scale: float | None = None) -> Array:
    """A head-dim path that only reads the first 128 channels of q and k: wrong only for
    E > 128 (the scale stays 1/sqrt(E))."""
    a = _arranged(q, k, v, mask, bias, is_causal, scale)
    a = a.with_(q=a.q[..., :WIDEST_VECTOR_PATH], k=a.k[..., :WIDEST_VECTOR_PATH])
    s, allowed = scores(a)
    return finish(combine(softmax_lse(s, allowed), allowed, a.v), a)


SPLIT = 256


@declare(bias=True, gqa=True)
def decode_splits_averaged(q: Array, k: Array, v: Array, *, mask: Array | None = None,
                           bias: Array | None = None, is_causal: bool = False,
                           scale: float | None = None) -> Array:
    """A flash-decoding path for one query against more than 256 keys: each split of 256
    keys is normalised on its own and the splits' outputs are averaged, not weighted by
    their log-sum-exp.  Every other shape takes the exact path."""
    a = _arranged(q, k, v, mask, bias, is_causal, scale)
    s, allowed = scores(a)
    n_queries, n_keys = s.shape[-2], s.shape[-1]
    if n_queries != 1 or n_keys <= SPLIT:
        return finish(combine(softmax_lse(s, allowed), allowed, a.v), a)
    parts, seen = [], []
    for start in range(0, n_keys, SPLIT):
        blk = slice(start, start + SPLIT)
        part_allowed = allowed[..., blk]
        parts.append(combine(softmax_lse(s[..., blk], part_allowed), part_allowed,
                             a.v[..., blk, :]))
        seen.append(part_allowed.any(axis=-1)[..., None])
    count = np.sum(seen, axis=0)
    with np.errstate(invalid="ignore"):
        out = np.where(count > 0, np.sum(parts, axis=0) / np.maximum(count, 1), 0.0)
    return finish(out.astype(s.dtype), a)


SCALE_BUGS: list[tuple[Callable[..., Array], Callable[[str], bool]]] = [
    # (kernel, what its shrunk counterexample must show)
    (tiled_without_rescale, lambda inputs: _keys(inputs) > BLOCK),
    (ragged_tail_dropped, lambda inputs: _keys(inputs) > BLOCK and _keys(inputs) % BLOCK != 0),
    (wide_head_dim_truncated, lambda inputs: _head_dim(inputs) > WIDEST_VECTOR_PATH),
    (decode_splits_averaged, lambda inputs: _queries(inputs) == 1 and _keys(inputs) > SPLIT),
]


def _shape(inputs: str, name: str) -> tuple[int, ...]:
    """The shape of ``name`` (q, k or v) in a counterexample's description."""
    start = inputs.index(f"{name}(") + len(name) + 1
    return tuple(int(n) for n in inputs[start:inputs.index(")", start)].split(",") if n.strip())


def _keys(inputs: str) -> int:
    return _shape(inputs, "k")[-2]


def _queries(inputs: str) -> int:
    return _shape(inputs, "q")[-2]


def _head_dim(inputs: str) -> int:
    return _shape(inputs, "q")[-1]


def _numpy_kernel(fn: Callable[..., Any], **claims: Any) -> KernelUnderTest:
    return KernelUnderTest(fn, Backend("numpy"), declaration_of(fn, **claims))


@pytest.fixture
def small_only(monkeypatch: pytest.MonkeyPatch) -> str:
    """A profile of the quick profile's small stratum alone."""
    monkeypatch.setitem(PROFILES, "small-only", Profile(PROFILES["quick"].small))
    return "small-only"


@pytest.mark.parametrize("bug", [b for b, _ in SCALE_BUGS], ids=lambda fn: fn.__name__)
def test_scale_bug_is_exact_on_small_problems(bug: Callable[..., Array], small_only: str) -> None:
    """SDPA-7.3: each scale bug passes matches-reference on the small stratum alone, so
    only the realistic strata can catch it."""
    verdict = run_property(all_properties()["matches-reference"], _numpy_kernel(bug),
                           profile=small_only)
    assert verdict.status == PASSED, verdict.detail


@pytest.mark.parametrize(("bug", "shows_scale"), SCALE_BUGS, ids=lambda x: getattr(x, "__name__", ""))
def test_quick_profile_catches_scale_bug(bug: Callable[..., Array],
                                         shows_scale: Callable[[str], bool]) -> None:
    """SDPA-7.3: the quick profile's matches-reference fails each scale bug, and the shrunk
    counterexample has the size that triggers it (e.g. 65 keys: one past a block)."""
    verdict = run_property(all_properties()["matches-reference"], _numpy_kernel(bug),
                           profile="quick")
    assert verdict.status == FAILED, f"{bug.__name__}: {verdict.status}"
    assert shows_scale(verdict.counterexample), verdict.counterexample


def test_block_tail_bug_shrinks_to_one_past_the_block() -> None:
    """SDPA-7.3: a failure shrinks down the sorted length list to the smallest failing
    size: the ragged-tail bug's counterexample has 65 keys (64 + 1)."""
    verdict = run_property(all_properties()["matches-reference"],
                           _numpy_kernel(ragged_tail_dropped), profile="quick")
    assert _keys(verdict.counterexample) == BLOCK + 1, verdict.counterexample


CORRECT_SUBJECTS = [
    ("lse", lse_attention, "numpy", {}),
    ("online-softmax", online_softmax_attention, "numpy", {}),
    ("reference", reference_sdpa, "numpy", {"bias": True, "gqa": True}),
]


def _realistic_only(monkeypatch: pytest.MonkeyPatch) -> str:
    quick = PROFILES["quick"]
    monkeypatch.setitem(PROFILES, "realistic-quick",
                        Profile(0, blocks=quick.blocks, decode=quick.decode,
                                corners=quick.corners))
    return "realistic-quick"


@pytest.mark.parametrize(("name", "fn", "backend", "claims"), CORRECT_SUBJECTS,
                         ids=[s[0] for s in CORRECT_SUBJECTS])
def test_correct_kernels_pass_realistic_strata(
    name: str, fn: Callable[..., Any], backend: str, claims: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CONF-1: correct kernels pass every applicable property on the quick profile's
    realistic strata (the small stratum is tests/test_correct_kernels_pass.py's)."""
    profile = _realistic_only(monkeypatch)
    kernel = KernelUnderTest(fn, Backend(backend), declaration_of(fn, **claims))
    bad = []
    for prop in all_properties().values():
        verdict = run_property(prop, kernel, profile=profile)
        if verdict.status not in (PASSED, NOT_APPLICABLE):
            bad.append(f"{prop.id}: {verdict.status}: {verdict.detail}\n  {verdict.counterexample}")
    assert not bad, "\n".join(bad[:3])
