"""Tiled and split-KV attention from the catalogue's building blocks, laid out as
FlashAttention and flash-decoding lay out the work.

Queries are cut into blocks of rows; each block visits the keys in blocks with an
online softmax (:func:`catalogue.blocks.online_pass`), skipping whole key blocks past
its causal boundary.  With ``split`` set, the keys are first cut into chunks (one per
program in flash-decoding); each chunk yields its own (max, sum, normalised output) and
the chunks are merged by log-sum-exp.  Only one (query block, keys) tile of scores
exists at a time, so memory stays bounded at realistic sizes.

Every step a real kernel can get wrong at scale is a field of :class:`Tiling`, so a
buggy kernel in :mod:`catalogue.bugs_tiling` is a correct tiling with one step replaced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from .blocks import (
    EXACT_RESCALE,
    QUIET,
    Operands,
    Rescale,
    Running,
    normalise,
    online_pass,
    ragged_blocks,
    scores,
)

Blocks = Callable[[int, int], list[slice]]


def causal_key_limit(rows: slice, ops: Operands, key_block: int) -> int:
    """Block skipping: how many keys a block of query rows visits — up to the causal
    boundary of its last row (j <= i + offset, SDPA-4.1/4.2), rounded up to whole key
    blocks; every key without is_causal."""
    if ops.causal_offset is None:
        return ops.n_keys
    reach = rows.stop + ops.causal_offset  # keys 0 .. reach - 1 are within the boundary
    return min(ops.n_keys, max(0, -(-reach // key_block) * key_block))


class Chunk(NamedTuple):
    """One split's result, as flash-decoding stores it: max, sum and normalised output."""

    m: np.ndarray
    total: np.ndarray
    out: np.ndarray


def chunk_weight(m: np.ndarray, top: np.ndarray, total: np.ndarray) -> np.ndarray:
    """exp(lse_c - max_c' m_c') = exp(m_c - M) l_c: the chunk's share of the row's
    softmax mass, without forming lse_c = m_c + log l_c (which rounds to |m_c|)."""
    return np.exp(m - top) * total


def merge_chunks(
    chunks: list[Chunk],
    weight: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] = chunk_weight,
) -> np.ndarray:
    """sum_c w_c out_c / sum_c w_c with w_c = exp(lse_c - LSE) up to a common factor.

    An empty chunk has m = -inf and l = 0, so weight 0; a row empty in every chunk
    outputs 0 (SDPA-5); a NaN max reaches every weight of its row (SDPA-8.3).
    """
    m = np.stack([c.m for c in chunks])
    top = np.max(m, axis=0)
    top = np.where(top == -np.inf, top.dtype.type(0), top)
    with np.errstate(**QUIET):
        weights = np.stack([weight(c.m, top, c.total) for c in chunks])
        total = np.sum(weights, axis=0)
        merged = np.sum(weights * np.stack([c.out for c in chunks]), axis=0)
        empty = total == 0
        return np.where(
            empty, merged.dtype.type(0), merged / np.where(empty, total.dtype.type(1), total)
        )


@dataclass(frozen=True)
class Tiling:
    """The steps of a tiled kernel: block sizes, the blocks and chunks the keys are cut
    into, block skipping, the online softmax's rescaling and the split-KV merge."""

    query_block: int = 128
    key_block: int = 64
    split: int | None = None  # keys per split-KV chunk; None: one pass over all keys
    key_limit: Callable[[slice, Operands, int], int] = causal_key_limit
    chunks: Blocks = ragged_blocks
    key_blocks: Blocks = ragged_blocks
    rescale: Rescale = EXACT_RESCALE
    chunk_weight: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] = chunk_weight

    def with_(self, **changes: Any) -> Tiling:
        return replace(self, **changes)


def _row_block(ops: Operands, rows: slice, tiling: Tiling) -> np.ndarray:
    """The outputs of one block of query rows: online softmax per chunk, then the merge."""
    limit = tiling.key_limit(rows, ops, tiling.key_block)
    a = ops.tile(rows, slice(0, limit))
    s, allowed = scores(a)
    parts = []
    for chunk in tiling.chunks(limit, tiling.split or max(limit, 1)):
        state: Running = online_pass(
            s[..., chunk],
            allowed[..., chunk],
            a.v[..., chunk, :],
            block=tiling.key_block,
            blocks=tiling.key_blocks,
            rescale=tiling.rescale,
        )
        parts.append(Chunk(state.m, state.total, normalise(state)))
    if not parts:  # no key within reach of any row of the block (SDPA-5)
        return np.zeros((*a.q.shape[:-1], a.v.shape[-1]), dtype=a.q.dtype)
    return parts[0].out if len(parts) == 1 else merge_chunks(parts, tiling.chunk_weight)


RowBlock = Callable[[Operands, slice], np.ndarray]


def by_row_blocks(ops: Operands, row_block: RowBlock, query_block: int) -> np.ndarray:
    """One program per block of query rows, each writing its rows of the output; the
    result in q's dtype (SDPA-1.3)."""
    out = np.zeros((*ops.q.shape[:-1], ops.v.shape[-1]), dtype=ops.q.dtype)
    for rows in ragged_blocks(ops.n_queries, query_block):
        out[..., rows, :] = row_block(ops, rows)
    return out.astype(ops.out_dtype)


def tiled(ops: Operands, tiling: Tiling) -> np.ndarray:
    """Attention block of query rows by block, as ``tiling`` lays it out."""
    return by_row_blocks(ops, lambda o, rows: _row_block(o, rows, tiling), tiling.query_block)
