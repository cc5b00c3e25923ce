"""Buggy kernels, part 4: tiling bugs that only exist at realistic scale (SDPA-7.3, TOL-2).

Each kernel is the correct tiled kernel of :mod:`catalogue.tiled` — blocks of 128
query rows and 64 keys, or flash-decoding chunks of 256 keys — with exactly one step of
its :class:`~catalogue.tiled.Tiling` replaced.  With at most 64 keys (one key block,
one chunk) and at most 64 query rows every one of them computes exactly what the
correct kernel does; the bug needs a second block, a ragged tail or a second chunk.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .blocks import CausalRule, Operands, Rescale, operands, ragged_blocks
from .entry import ALL, SpecCall, spec_kernel
from .tiled import Tiling, tiled

Array = np.ndarray
BOTTOM_RIGHT = {**ALL, "causal_alignment": "bottom_right"}
TILING = Tiling(query_block=128, key_block=64)
SPLIT_KV = Tiling(query_block=64, key_block=64, split=256)


def _ops(call: SpecCall, alignment: str = "top_left") -> Operands:
    return call.pass_to(partial(operands, alignment=alignment))


# --- key blocks and their tails ------------------------------------------------------


def _end_aligned_last_block(n: int, size: int) -> list[slice]:
    blocks = ragged_blocks(n, size)
    if n > size and n % size:
        blocks[-1] = slice(n - size, n)
    return blocks


@spec_kernel(**ALL)
def tiled_duplicates_key_tail(call: SpecCall) -> Array:
    """Loads the ragged last key block as the 64 keys ending at Lk (a full-width load,
    no bounds check) but forgets to mask the keys it shares with the previous block:
    when Lk > 64 and Lk % 64 != 0, those 64 - Lk % 64 keys are counted twice."""
    ops = _ops(call)
    return tiled(ops, TILING.with_(key_blocks=_end_aligned_last_block))


def _at_least_one_whole_block(n: int, size: int) -> list[slice]:
    count = max(1, n // size)
    return [slice(i * size, min((i + 1) * size, n)) for i in range(count)]


@spec_kernel(**ALL)
def tiled_drops_key_tail(call: SpecCall) -> Array:
    """Counts key blocks as max(1, Lk // 64) — floor, with a guard added after short
    sequences crashed — so for Lk > 64 the last Lk % 64 keys are never visited."""
    ops = _ops(call)
    return tiled(ops, TILING.with_(key_blocks=_at_least_one_whole_block))


# --- rescaling the running state ----------------------------------------------------


@spec_kernel(**ALL)
def tiled_accumulator_not_rescaled(call: SpecCall) -> Array:
    """Rescales the running sum by exp(m_old - m_new) when a later key block raises the
    running max, but not the output accumulator: earlier blocks keep their old weight
    in the numerator.  One 64-key block never rescales, so Lk <= 64 is exact."""
    ops = _ops(call)
    return tiled(ops, TILING.with_(rescale=Rescale(total=np.exp, acc=np.ones_like)))


@spec_kernel(**ALL)
def exp2_rescale_without_log2e(call: SpecCall) -> Array:
    """Computes in base 2 (scores folded by log2(e), exp2 instead of exp), but the
    rescale factor between key blocks is exp2(m_old - m_new) on the max kept in natural
    units: log2(e) is forgotten in that one path, so earlier blocks are overweighted by
    2**d / e**d whenever the max grows in a later block."""
    ops = _ops(call)
    return tiled(ops, TILING.with_(rescale=Rescale(total=np.exp2, acc=np.exp2)))


# --- split-KV (flash-decoding) merges ---------------------------------------------


@spec_kernel(**BOTTOM_RIGHT)
def split_kv_merge_ignores_chunk_max(call: SpecCall) -> Array:
    """Merges the split-KV chunks by their sums l_c alone, as if every chunk's sum were
    relative to the same max: each chunk's exp(m_c - M) is dropped, so a chunk of low
    scores weighs as much as one of high scores.  Exact with one chunk (Lk <= 256)."""
    ops = _ops(call, "bottom_right")
    return tiled(ops, SPLIT_KV.with_(chunk_weight=lambda m, top, total: total))


@spec_kernel(**BOTTOM_RIGHT)
def split_kv_merge_forgets_chunk_sum(call: SpecCall) -> Array:
    """Weights each chunk's normalised output by exp(m_c - M) but forgets its sum l_c
    (exp(lse_c - LSE) taken as exp(m_c - M)): a chunk of many similar keys weighs as
    much as a chunk of one.  Exact with one chunk (Lk <= 256)."""
    ops = _ops(call, "bottom_right")
    return tiled(ops, SPLIT_KV.with_(chunk_weight=lambda m, top, total: np.exp(m - top)))


def _floor_length_chunks(n: int, size: int) -> list[slice]:
    count = -(-n // size)
    length = n // count if count else 0
    return [slice(c * length, (c + 1) * length) for c in range(count)]


@spec_kernel(**BOTTOM_RIGHT)
def split_kv_floor_chunk_length(call: SpecCall) -> Array:
    """Splits Lk keys into n = ceil(Lk / 256) chunks of Lk // n keys (floor): the last
    Lk % n keys belong to no chunk (Lk = 1023: 4 chunks of 255, keys 1020-1022 lost;
    Lk = 1024 or 1025 happen to divide).  One chunk for Lk <= 256 is exact."""
    ops = _ops(call, "bottom_right")
    return tiled(ops, SPLIT_KV.with_(chunks=_floor_length_chunks))


# --- causal block skipping ----------------------------------------------------------


def _top_left_key_limit(rows: slice, ops: Operands, key_block: int) -> int:
    if ops.causal_offset is None:
        return ops.n_keys
    return min(ops.n_keys, -(-rows.stop // key_block) * key_block)


@spec_kernel(**BOTTOM_RIGHT)
def causal_skip_uses_top_left_limit(call: SpecCall) -> Array:
    """A bottom-right causal kernel (SDPA-4.2) whose block skipping still computes the
    last key block a query block needs with the top-left formula ceil(row_end / 64):
    masking inside the visited blocks is right, but with Lk > Lq whole key blocks
    within the boundary are skipped (a decode step with Lq = 1 sees only keys 0-63)."""
    ops = _ops(call, "bottom_right")
    return tiled(ops, TILING.with_(key_limit=_top_left_key_limit))


def _masks_last_visited_block_only(ops: Operands, tiling: Tiling) -> CausalRule:
    """The causal rule as a kernel applies it that masks only the last key block each
    query block visits and reads the blocks before it unmasked."""
    offset, n_queries, n_keys = ops.causal_offset or 0, ops.n_queries, ops.n_keys
    qb, kb = tiling.query_block, tiling.key_block

    def rule(rows: Array, keys: Array) -> Array:
        block_stop = np.minimum((rows // qb + 1) * qb, n_queries)
        limit = np.clip(-(-(block_stop + offset) // kb) * kb, 0, n_keys)
        last_block_start = (np.maximum(limit, 1) - 1) // kb * kb
        return (keys[None, :] <= rows[:, None] + offset) | (
            keys[None, :] < last_block_start[:, None]
        )

    return rule


@spec_kernel(**ALL)
def causal_masks_last_key_block_only(call: SpecCall) -> Array:
    """Applies the causal mask only in the last key block a query block visits
    (n_masking_steps = 1, right only while query blocks are no taller than key blocks):
    with 128-row query blocks over 64-key blocks the block before the diagonal one is
    read unmasked, so for Lq, Lk > 64 early rows see future keys (SDPA-4.1)."""
    ops = _ops(call)
    if ops.causal is not None:
        ops = ops.with_(causal=_masks_last_visited_block_only(ops, TILING))
    return tiled(ops, TILING)


def _tail_block_with_unshifted_rows(ops: Operands, query_block: int) -> CausalRule:
    """The causal rule of a kernel that runs the ragged last query block as the
    ``query_block`` rows ending at Lq, but takes the rows' causal boundaries from the
    unshifted block start."""
    offset, n_queries = ops.causal_offset or 0, ops.n_queries
    ragged = n_queries % query_block
    shift = query_block - ragged if n_queries > query_block and ragged else 0

    def rule(rows: Array, keys: Array) -> Array:
        seen_as = rows + np.where(rows >= n_queries - query_block, shift, 0)
        return keys[None, :] <= seen_as[:, None] + offset

    return rule


@spec_kernel(**ALL)
def causal_tail_query_block_misaligned(call: SpecCall) -> Array:
    """Runs the ragged last query block as the 128 rows ending at Lq (a full-height
    load, rows it shares with the previous block recomputed) but builds their causal
    mask from the unshifted block start: for Lq > 128 with Lq % 128 != 0 those rows see
    128 - Lq % 128 future keys (SDPA-4.1)."""
    ops = _ops(call)
    if ops.causal is not None:
        ops = ops.with_(causal=_tail_block_with_unshifted_rows(ops, TILING.query_block))
    return tiled(ops, TILING)
