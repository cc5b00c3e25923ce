"""The dense clauses every family is held to (SDPA-1.3, SDPA-1.6, SDPA-7.5): sparse, linear
and FAVOR+ kernels pass them, and a bug in one of them is caught.
"""

from __future__ import annotations

import numpy as np
import pytest
from family_kernels import (
    assert_status,
    numpy_favor,
    reference_linear,
    reference_sparse,
)
from support import verdict_of

from attnspec.conformance.judge.verdict import FAILED, PASSED


def test_family_kernels_must_keep_the_dtype() -> None:
    """SDPA-1.3 for sparse and linear kernels: an output upcast to float64 fails the family's
    matching property, not just a dense-only one."""
    sparse = reference_sparse("sliding_window")

    def upcast_sparse(q, k, v, *, scale=None):
        return sparse(q, k, v, scale=scale).astype(np.float64)

    upcast_sparse.__attnspec__ = sparse.__attnspec__
    assert "dtype" in verdict_of("sparse-matches-dense", upcast_sparse, shrink=False).detail
    linear = reference_linear()

    def upcast_linear(q, k, v, *, is_causal=False):
        return linear(q, k, v, is_causal=is_causal).astype(np.float64)

    upcast_linear.__attnspec__ = linear.__attnspec__
    assert "dtype" in verdict_of("linear-matches-formula", upcast_linear, shrink=False).detail


@pytest.mark.parametrize("property_id", ["deterministic", "inputs-unmodified"])
def test_generic_properties_apply_to_every_family(property_id: str) -> None:
    """SDPA-7.5, SDPA-1.6 hold for sparse, linear and FAVOR+ kernels too (CONF-3: claimed by
    being an attention kernel at all); block-sparse layouts get lengths they allow."""
    for case in ("block_sparse", "bigbird"):
        assert_status(reference_sparse(case), property_id, PASSED)
    assert_status(reference_linear(), property_id, PASSED)
    assert_status(numpy_favor(64), property_id, PASSED)


def test_generic_property_bugs_in_other_families_are_caught() -> None:
    """SDPA-7.5: a FAVOR+ kernel that ignores its seed (fresh features each call) is not
    deterministic; SDPA-1.6: a linear kernel that rescales q in place modifies its input."""
    seeded = numpy_favor(64)

    def ignores_seed(q, k, v, *, seed, is_causal=False):
        return seeded(q, k, v, seed=int(np.random.default_rng().integers(1 << 30)))

    ignores_seed.__attnspec__ = seeded.__attnspec__
    assert_status(ignores_seed, "deterministic", FAILED)
    linear = reference_linear()

    def scales_q_in_place(q, k, v, *, is_causal=False):
        q *= 0.5
        return linear(q, k, v, is_causal=is_causal)

    scales_q_in_place.__attnspec__ = linear.__attnspec__
    assert_status(scales_q_in_place, "inputs-unmodified", FAILED)
