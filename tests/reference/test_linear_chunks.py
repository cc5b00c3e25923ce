"""The causal linear form evaluated in key chunks (``reference.linear._prefix_sums``).

Causal linear attention reads prefix sums of ``fk_j v_j^T``; the reference forms them a
chunk of keys at a time so that time and memory stay linear in L (LIN-1.2).  Every chunk
size, including 1, sizes that do not divide Lk and sizes beyond it, gives the masked
quadratic sums of LIN-2.1 for both alignments and Lq != Lk, rows that see no key give
exactly 0 (LIN-1.4), and a NaN reaches only the rows whose prefix contains it.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnspec.backends import Backend
from attnspec.reference.linear import _prefix_sums
from attnspec.reference.masks import causal_offset


def masked_sums(
    fq: np.ndarray, fk: np.ndarray, v: np.ndarray, offset: int
) -> tuple[np.ndarray, np.ndarray]:
    """LIN-2.1 written out: sum over j <= i + d of A_ij v_j and of A_ij."""
    scores = fq @ np.swapaxes(fk, -1, -2)
    keys = np.arange(fk.shape[-2])[None, :] <= np.arange(fq.shape[-2])[:, None] + offset
    scores = np.where(keys, scores, 0.0)
    return scores @ v, np.sum(scores, axis=-1, keepdims=True)


# A backend that compiles every new shape (JAX) runs three of the nine (lengths, chunk)
# pairs, each in both alignments, which together take every path the nine take (issue 33:
# the nine compiled 274 operations, these three 123; the other backends run all nine):
# chunks of 3 on Lk = 5 (a ragged last chunk), Lq = 11 > Lk (top-left: the last chunk
# takes the rows after the last key; bottom-right: 6 rows see no key); chunks of 1 key on
# Lq = 5 < Lk = 11 (chunks holding no query's last key, only carried on: keys 0-5
# bottom-right, 5-10 top-left); one chunk of 64 past Lq = Lk = 7.
COMPILED_CASES = {(11, 5, 3), (5, 11, 1), (7, 7, 64)}


@pytest.mark.parametrize(("n_queries", "n_keys"), [(7, 7), (5, 11), (11, 5)])
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_every_chunk_size_gives_the_masked_sums(
    cpu_backend: Backend, n_queries: int, n_keys: int, alignment: str, chunk: int
) -> None:
    """LIN-2.1, LIN-1.4: float64 sums equal the masked quadratic form to ~1e-12 (JAX: the
    pairs of COMPILED_CASES)."""
    if cpu_backend.compiles_per_shape and (n_queries, n_keys, chunk) not in COMPILED_CASES:
        pytest.skip("a compiling backend runs the pairs of COMPILED_CASES only (cost)")
    rng = np.random.default_rng(n_queries * 31 + n_keys)
    fq = rng.random((2, 3, n_queries, 4))
    fk, v = rng.random((2, 1, n_keys, 4)), rng.standard_normal((2, 1, n_keys, 2))
    offset = causal_offset(n_queries, n_keys, alignment)
    numerator, denominator = _prefix_sums(
        cpu_backend.xp,
        *(cpu_backend.asarray(a, "float64") for a in (fq, fk, v)),
        offset,
        chunk=chunk,
    )
    expected = masked_sums(fq, fk, v, offset)
    for got, want in zip((numerator, denominator), expected, strict=True):
        got = np.asarray(cpu_backend.to_numpy(got))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        blind = np.arange(n_queries) + offset < 0
        assert np.all(got[..., blind, :] == 0)


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_nan_reaches_only_later_rows(chunk: int) -> None:
    """LIN-2.1: key 4 is in the prefix of rows i >= 4 only (top-left); a NaN value there
    makes those rows NaN and leaves rows 0-3 as they were, whatever the chunk."""
    rng = np.random.default_rng(0)
    fq, fk, v = rng.random((9, 3)), rng.random((9, 3)), rng.standard_normal((9, 2))
    clean = _prefix_sums(Backend("numpy").xp, fq, fk, v, 0, chunk=chunk)[0]
    v[4, 1] = np.nan
    poisoned = _prefix_sums(Backend("numpy").xp, fq, fk, v, 0, chunk=chunk)[0]
    assert np.array_equal(poisoned[:4], clean[:4])
    assert np.all(np.isnan(poisoned[4:, 1])) and np.all(np.isfinite(poisoned[:, 0]))
