"""Buggy kernels, part 5: code paths taken only at realistic sizes and values (SDPA-7.3, TOL-2).

Real kernels dispatch on the shapes — head-dim vector widths, the number of programs,
the GQA group size, decode (Lq = 1), the batch size, a maximum cache length, padding
biases — and each
path is a place for a bug the small shapes never reach.  Each kernel here is the
correct tiled kernel of :mod:`catalogue.tiled` with one path wrong; the docstring says
which, and the sizes below which it is exact.
"""

from __future__ import annotations

import math

import numpy as np

from .blocks import Operands, contiguous_groups, operands
from .entry import ALL, SpecCall, spec_kernel
from .tiled import Tiling, tiled

Array = np.ndarray
TILING = Tiling(query_block=128, key_block=64)
DECODE_TILING = Tiling(query_block=64, key_block=64, split=256)
VECTOR_WIDTH = 32  # head-dim elements one vectorised step handles
INT16_PROGRAMS = 2**15  # programs an int16 index can number
LARGE_GROUP = 4  # GQA group size from which the special path is taken
DECODE_MIN_KEYS = 256  # Lq = 1 with more keys than this takes the decode path
LARGE_BATCH = 4  # more batch elements than this take the large-batch path
KV_CAPACITY = 2048  # keys a fixed-size KV buffer holds


def _ops(call: SpecCall) -> Operands:
    return call.pass_to(operands)


def _whole_vectors(n: int) -> int:
    """How many of n head-dim elements a kernel without a remainder loop covers beyond
    one vector: the whole vectors (below one vector, the scalar path covers all n)."""
    return n if n <= VECTOR_WIDTH else n - n % VECTOR_WIDTH


# --- head-dim vector tails ------------------------------------------------------------


@spec_kernel(**ALL)
def head_dim_tail_dropped(call: SpecCall) -> Array:
    """Forms q.k in 32-wide vector steps with no remainder loop once E > 32 (E <= 32
    takes a scalar path): the last E % 32 features are left out of the scores (E = 59
    keeps 32, E = 111 keeps 96); the scale is still 1/sqrt(E)."""
    q, *_ = call
    ops = _ops(call)
    used = _whole_vectors(q.shape[-1])
    return tiled(ops.with_(q=ops.q[..., :used], k=ops.k[..., :used]), TILING)


@spec_kernel(**ALL)
def value_dim_tail_unwritten(call: SpecCall) -> Array:
    """Stores the output in 32-wide vector steps with no remainder store once Ev > 32:
    the last Ev % 32 output columns keep the zeros the buffer was allocated with."""
    v = call.v
    out = tiled(_ops(call), TILING)
    out[..., _whole_vectors(v.shape[-1]) :] = 0
    return out


# --- program indices ------------------------------------------------------------------


@spec_kernel(**ALL)
def program_index_int16(call: SpecCall) -> Array:
    """Numbers its (batch, head, query row) programs with an int16 index: once
    B * H * Lq exceeds 2**15 the index wraps negative and those rows are written with
    the output of a row counted from the end (8 heads of 4096 queries already do)."""
    out = tiled(_ops(call), TILING)
    flat = out.reshape(math.prod(out.shape[:-1]), out.shape[-1])
    program = np.arange(flat.shape[0]).astype(np.int16)
    return flat[program].reshape(out.shape)


# --- head mapping (SDPA-6) --------------------------------------------------------------


def _large_group_heads(n_q_heads: int, n_kv_heads: int) -> Array:
    if n_q_heads // n_kv_heads >= LARGE_GROUP:
        return np.arange(n_q_heads) % n_kv_heads
    return contiguous_groups(n_q_heads, n_kv_heads)


@spec_kernel(**ALL)
def gqa_large_group_modulo(call: SpecCall) -> Array:
    """Takes a special path for GQA groups of 4 or more query heads (as decode kernels
    pack a whole group into one tile) that maps query head h to key/value head
    h % Hkv instead of h // G (SDPA-6.1); groups of 2 or 3 take the right path."""
    q, k, v, mask, bias, is_causal, scale = call
    ops = operands(
        q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale, heads=_large_group_heads
    )
    return tiled(ops, TILING)


# --- dispatch on the shapes ------------------------------------------------------------


@spec_kernel(**ALL)
def decode_path_ignores_mask(call: SpecCall) -> Array:
    """Sends a decode step (Lq = 1) with more than 256 keys to a flash-decoding split-KV
    kernel that takes cache lengths, not masks: the boolean mask is dropped on that
    path only."""
    ops = _ops(call)
    if ops.n_queries == 1 and ops.n_keys > DECODE_MIN_KEYS:
        return tiled(ops.with_(mask=None), DECODE_TILING)
    return tiled(ops, TILING)


@spec_kernel(**ALL)
def large_batch_mask_from_first_element(call: SpecCall) -> Array:
    """Takes a large-batch path for more than 4 batch elements that assumes the mask is
    shared by the batch and reads batch element 0's: every other element gets element
    0's padding."""
    ops = _ops(call)
    batch = ops.q.shape[:-3]
    if ops.mask is not None and math.prod(batch) > LARGE_BATCH:
        first = ops.mask[(0,) * len(batch)]
        ops = ops.with_(mask=np.broadcast_to(first, ops.mask.shape))
    return tiled(ops, TILING)


@spec_kernel(**ALL)
def kv_buffer_truncates_at_2048(call: SpecCall) -> Array:
    """Copies K and V into a fixed KV buffer of 2048 keys before attending: longer key
    sequences are silently truncated to their first 2048 keys."""
    ops = _ops(call)
    kept = slice(0, KV_CAPACITY)
    return tiled(
        ops.with_(
            k=ops.k[..., kept, :],
            v=ops.v[..., kept, :],
            mask=None if ops.mask is None else ops.mask[..., kept],
            bias=None if ops.bias is None else ops.bias[..., kept],
        ),
        TILING,
    )


# --- extreme values -------------------------------------------------------------------


@spec_kernel(**ALL)
def padding_bias_read_as_mask(call: SpecCall) -> Array:
    """Turns an additive padding bias into a key mask for its faster masked path: a bias
    at or below finfo(dtype).min / 2 is taken as "masked".  A finite bias is attended
    (SDPA-3.3: only -inf excludes), so where a row's keys are all padded with
    finfo.min — a padded query in a padded batch — the output is 0 instead of the
    softmax of its scores; rows with an unpadded key are unaffected."""
    ops = _ops(call)
    if ops.bias is not None:
        padded = ops.bias <= np.finfo(ops.bias.dtype).min / 2
        ops = ops.with_(mask=~padded if ops.mask is None else ops.mask & ~padded)
    return tiled(ops, TILING)
