"""CONF-8: profiles nest.  Each stratum of a larger profile first runs that stratum of the
smaller profiles exactly as they run it (the same Hypothesis seed, example count and
shape pools), so whatever quick finds, default and thorough find too."""

from __future__ import annotations

import itertools
import zlib
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from catalogue.buggy import CATALOGUE
from catalogue.entry import SpecCall, spec_kernel
from support import backend_or_skip, compiling

from attnspec.conformance.draw.shape_pool import pool_for_run
from attnspec.conformance.draw.sizes import SizeLimits, current
from attnspec.conformance.judge.kernel import KernelUnderTest
from attnspec.conformance.judge.registry import all_properties
from attnspec.conformance.judge.verdict import FAILED
from attnspec.conformance.run.property_runner import (
    NESTED,
    PROFILES,
    _nested_parts,
    run_property,
)
from attnspec.reference import scaled_dot_product_attention as reference_sdpa

# Small enough that every stratum of the default profile costs milliseconds per example.
LIMITS = SizeLimits(max_len=33, max_head_dim=16, max_batch_heads=8)
Array = Any


def test_every_stratum_grows_from_quick_to_thorough() -> None:
    """CONF-8: no stratum of a larger profile has fewer examples than a smaller one's, for
    the dense properties' strata and the paged-batch ones' (their anchors, mixed batches)."""
    for draws in ("dense", "paged-batch"):
        for smaller, larger in itertools.pairwise(NESTED):
            counts = {s.name: s.examples for s in PROFILES[larger].strata(SizeLimits(), draws)}
            for stratum in PROFILES[smaller].strata(SizeLimits(), draws):
                assert counts.get(stratum.name, 0) >= stratum.examples, (larger, stratum)


def test_larger_profiles_run_the_smaller_ones_parts_first() -> None:
    """CONF-8: a stratum's Hypothesis runs in a larger profile begin with the smaller
    profile's runs of it, the same (stratum, examples, seed), then add examples past
    them under other seeds."""
    prop = all_properties()["matches-reference"]
    for seed in (None, 7):
        for smaller, larger in itertools.pairwise(NESTED):
            big = {s.name: s for s in PROFILES[larger].strata(SizeLimits())}
            for stratum in PROFILES[smaller].strata(SizeLimits()):
                small_parts = _nested_parts(smaller, stratum, SizeLimits(), seed, prop)
                large_parts = _nested_parts(larger, big[stratum.name], SizeLimits(), seed, prop)
                assert large_parts[: len(small_parts)] == small_parts
                assert sum(count for _, count, _ in large_parts) == big[stratum.name].examples
                assert len({part_seed for _, _, part_seed in large_parts}) == len(large_parts)


def recording(calls: dict[str, list[tuple[Any, ...]]]) -> Any:
    """The reference, recording each call's inputs (shapes, options, a checksum of the
    values) under the stratum it was drawn in."""

    @spec_kernel(bias=True, gqa=True)
    def kernel(call: SpecCall) -> Array:
        q, k, v, mask, bias, is_causal, scale = call
        arrays = [np.asarray(a) for a in (q, k, v, mask, bias) if a is not None]
        checksum = zlib.crc32(b"".join(a.tobytes() for a in arrays))
        shapes = tuple((a.shape, str(a.dtype)) for a in arrays)
        calls[current().stratum.name].append((shapes, is_causal, scale, checksum))
        return call.pass_to(reference_sdpa)

    return kernel


@pytest.mark.parametrize("pooled", [False, True], ids=["drawn", "pooled"])
def test_default_draws_quicks_problems_first(pooled: bool) -> None:
    """CONF-8: in every stratum, the first calls the default profile makes of a kernel
    are exactly the calls the quick profile makes (same inputs, values included), for
    drawn sizes and for the shape pools of a backend that compiles per shape, whose
    larger pools extend the smaller ones."""
    backend = compiling("numpy", compiles_per_shape=pooled)
    runs: dict[str, dict[str, list[tuple[Any, ...]]]] = {}
    for profile in ("quick", "default"):
        calls: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
        kernel = KernelUnderTest(recording(calls), backend)
        verdict = run_property(
            all_properties()["matches-reference"], kernel, profile=profile, limits=LIMITS
        )
        assert verdict.status == "passed", verdict.detail
        runs[profile] = calls
    quick, default = runs["quick"], runs["default"]
    assert set(quick) <= set(default)
    for stratum, made in quick.items():
        assert default[stratum][: len(made)] == made, stratum
    if pooled:  # a stratum's larger pools hold its smaller ones' members (shape_pool)
        pools = pool_for_run(None)._members
        for (*key, count), members in pools.items():
            smaller = [p for (*k, c), p in pools.items() if k == key and c < count]
            assert all(set(p) <= set(members) for p in smaller), key
        assert any(k == key and c < count for (*k, c) in pools for (*key, count) in pools), (
            "no stratum drew pools of two sizes"
        )


NESTING_BUGS = ("eps-in-denominator", "online-softmax-drops-tail", "mask-after-softmax")


@pytest.mark.parametrize("name", NESTING_BUGS)
def test_what_quick_finds_default_finds(name: str) -> None:
    """CONF-8: a catalogue bug that quick catches, default catches on the same first
    failing input (runs stop at the first failure: shrink=False)."""
    bug = next(b for b in CATALOGUE if b.name == name)
    kernel = KernelUnderTest(bug.fn, backend_or_skip(bug.backend))
    prop = all_properties()[bug.catches]
    quick, default = (
        run_property(prop, kernel, profile=profile, limits=LIMITS, shrink=False)
        for profile in ("quick", "default")
    )
    assert quick.status == FAILED, quick.detail
    assert (default.status, default.counterexample) == (quick.status, quick.counterexample)
