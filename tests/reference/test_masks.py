"""The mask builders against the spec's definitions (SDPA-3.1, SDPA-4.1 … SDPA-4.3)."""

from __future__ import annotations

import itertools

import numpy as np
import oracle
import pytest
from support import as64

from attnspec.backends import Backend
from attnspec.reference import (
    CAUSAL_ALIGNMENTS,
    causal_mask,
    padding_mask,
    plain_attention,
    scaled_dot_product_attention,
)
from attnspec.reference.tolerance import error_bound

ALL_SIZES = range(7)
# JAX compiles each operation anew for every shape (~0.1 s each on a busy CI core), so
# on JAX the grid keeps the edge sizes only: empty, one, and both orders of Lq vs Lk.
JAX_SIZES = (0, 1, 3, 6)


def allowed_count(i: int, n_queries: int, n_keys: int, alignment: str) -> int:
    """Keys row i may attend, in closed form: min(i+1, Lk) top-left (SDPA-4.1);
    clip(i+1 + Lk-Lq, 0, Lk) bottom-right (SDPA-4.2), 0 for the first Lq-Lk rows when
    Lq > Lk (SDPA-4.3)."""
    if alignment == "top_left":
        return min(i + 1, n_keys)
    return min(max(i + 1 + n_keys - n_queries, 0), n_keys)


@pytest.mark.parametrize("alignment", CAUSAL_ALIGNMENTS)
def test_causal_mask_all_small_sizes(backend: Backend, alignment: str) -> None:
    """SDPA-4.1, SDPA-4.2, SDPA-4.3: causal_mask equals the oracle's entry-by-entry
    definition and the closed-form row counts for every Lq, Lk in 0..6."""
    sizes = JAX_SIZES if backend.name == "jax" else ALL_SIZES
    for n_queries, n_keys in itertools.product(sizes, repeat=2):
        mask = causal_mask(n_queries, n_keys, alignment, xp=backend.xp, device=backend.device)
        assert mask.dtype == backend.xp.bool
        got = np.asarray(backend.to_numpy(mask))
        where = (n_queries, n_keys, alignment)
        assert got.shape == (n_queries, n_keys), where
        assert np.array_equal(got, oracle.causal_matrix(n_queries, n_keys, alignment)), where
        counts = [allowed_count(i, n_queries, n_keys, alignment) for i in range(n_queries)]
        assert np.array_equal(got.sum(axis=1), np.array(counts, dtype=int).reshape(-1)), where
        # Allowed keys form a prefix of the row: causal never skips a key.
        for row, count in zip(got, counts, strict=True):
            assert np.all(row[:count]) and not np.any(row[count:]), where


def test_causal_mask_matches_is_causal(cpu_backend: Backend) -> None:
    """SDPA-3.4, SDPA-4: mask=causal_mask(...) gives the same attention as is_causal with
    that alignment, and AND-ing another mask into it equals passing both: identical in
    the plain form (the same allowed set, the same arithmetic); within TOL-2 of the same
    value, so twice it of each other, in the entry point's blocked form, which reads the
    keys a causal chunk can see in other blocks than a mask's."""
    rng = np.random.default_rng(0)
    # Lq = 5 > Lk = 3 with GQA: the shapes of test_reference_oracle's family B, which JAX
    # has compiled already when the files run together.
    q, k, v = (rng.standard_normal(s) for s in ((3, 4, 5, 4), (3, 2, 3, 4), (3, 2, 3, 2)))
    extra = rng.random((5, 3)) < 0.6
    xp, device = cpu_backend.xp, cpu_backend.device
    qb, kb, vb = (cpu_backend.asarray(a, dtype="float64") for a in (q, k, v))
    extra_b = cpu_backend.asarray(extra)
    for alignment in CAUSAL_ALIGNMENTS:
        mask = causal_mask(5, 3, alignment, xp=xp, device=device)
        causal = {"is_causal": True, "causal_alignment": alignment}
        by_flag = plain_attention(qb, kb, vb, mask=extra_b, **causal)
        by_mask = plain_attention(qb, kb, vb, mask=xp.logical_and(mask, extra_b))
        assert np.array_equal(cpu_backend.to_numpy(by_flag), cpu_backend.to_numpy(by_mask))
        both = np.asarray(cpu_backend.to_numpy(xp.logical_and(mask, extra_b)))
        tolerance = error_bound(q, k, v, dtype="float64", mask=both).out_tolerance
        entry_flag = scaled_dot_product_attention(qb, kb, vb, mask=extra_b, **causal)
        entry_mask = scaled_dot_product_attention(qb, kb, vb, mask=xp.logical_and(mask, extra_b))
        difference = np.abs(as64(cpu_backend, entry_flag) - as64(cpu_backend, entry_mask))
        assert np.all(difference <= 2 * tolerance), alignment


def test_padding_mask(cpu_backend: Backend) -> None:
    """SDPA-3.1: padding_mask keeps key j of sequence b iff j < key_lengths[b] (True =
    may attend), shaped (batch, 1, 1, n_keys) to broadcast over heads and queries."""
    lengths = [0, 2, 5, 7]
    got = cpu_backend.to_numpy(
        padding_mask(lengths, 5, xp=cpu_backend.xp, device=cpu_backend.device)
    )
    expected = np.array([[j < n for j in range(5)] for n in lengths])[:, None, None, :]
    assert got.dtype == np.bool_ and np.array_equal(got, expected)


def test_padding_mask_equals_truncated_keys() -> None:
    """SDPA-3.1: attention with a padding mask equals attention over the first
    key_lengths[b] keys of each sequence; a zero length gives zeros (SDPA-5.1)."""
    import array_api_compat.numpy as xp

    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s) for s in ((3, 2, 4, 5), (3, 2, 6, 5), (3, 2, 6, 3)))
    lengths = [6, 3, 0]
    out = scaled_dot_product_attention(q, k, v, mask=padding_mask(lengths, 6, xp=xp))
    for b, n in enumerate(lengths):
        alone = scaled_dot_product_attention(q[b], k[b, :, :n], v[b, :, :n])
        scale = np.max(np.abs(v))
        assert np.all(np.abs(out[b] - alone) <= 1e-12 * scale), b
    assert np.all(out[2] == 0)
