"""Sparse attention that computes only the allowed pairs (spec/sparse.md, SPARSE-6).

For a chunk of queries, each pattern lists *candidate* keys: a padded integer array
``keys (T, S)`` shared by the ``bq`` query rows of each of T tiles (``bq = 1`` for the
per-query patterns, a query block for block-sparse), with ``ok`` marking candidates
that exist and are not listed twice.  Keys and values are gathered with ``xp.take``,
the pattern's own predicate (``SparsePattern.allowed``) decides which candidates are
in S(i), and the dense reference's helpers do the rest on the gathered
``(..., T, bq, S)`` scores.  No Lq x Lk array is ever made: a chunk holds about
:data:`CHUNK_PAIRS` (query row, candidate key) pairs over all batch elements and heads
together, so memory is that fixed amount (or one row's candidates, if more) plus the output:
it grows with the window and L, not with the number of heads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import array_api_compat

from .._array import Array
from .._checks import check_size
from ..sdpa import GroupedInputs, allowed_scores, prepare, softmax_over_allowed, weighted_values

# every pattern class, as parameters.py imports them: each module handles all six
from .definition import (
    BigBird,
    BlockSparse,
    Fixed,
    Longformer,
    SlidingWindow,
    SparsePattern,
    Strided,
    in_window,
    index_dtype,
)
from .parameters import Placement, build_pattern

# Gathered (query row, candidate key) pairs per chunk, over all batch elements and heads:
# bounds the temporaries to about CHUNK_PAIRS * (E + Ev + 4) numbers (34 MB at E = Ev = 64
# in float32) whatever Lq, the batch and the heads are.  Counted per batch element and
# head instead, H = 8 heads held 8 times as much (~300 MB), more than the dense blocked
# reference at the same length.
CHUNK_PAIRS = 2**16

Candidates = Callable[[int, int], tuple[Any, Any, Any]]


@dataclass(frozen=True)
class Segment:
    """Tiles ``start .. stop - 1``; ``make(a, b)`` gives rows (T, bq), keys (T, S), ok (T, S)."""

    start: int
    stop: int
    rows_per_tile: int
    width: int
    make: Candidates


def _attend(problem: GroupedInputs, rows: Any, keys: Any, allowed: Array) -> Any:
    """Attention of the queries ``rows (T, bq)`` over their candidate ``keys (T, S)``.

    ``allowed (T, bq, S)`` is S(i) on the candidates; returns ``(..., T * bq, Ev)``.
    """
    xp = problem.xp
    tiles, per_tile = rows.shape
    width = keys.shape[1]

    def gather(a: Any, index: Any, shape: tuple[int, int]) -> Any:
        picked = xp.take(a, xp.reshape(index, (-1,)), axis=-2)
        return xp.reshape(picked, (*picked.shape[:-2], *shape, picked.shape[-1]))

    tile = problem._replace(
        q=gather(problem.q, rows, (tiles, per_tile)),
        k=gather(problem.k, keys, (tiles, width)),
        v=gather(problem.v, keys, (tiles, width)),
        allowed=allowed,
    )
    scores, allowed = allowed_scores(tile)
    weights = softmax_over_allowed(xp, scores, allowed)
    out = weighted_values(xp, weights, allowed, tile.v)
    return xp.reshape(out, (*out.shape[:-3], tiles * per_tile, out.shape[-1]))


def _run(
    problem: GroupedInputs, sets: SparsePattern, segments: list[Segment], query_chunk: int | None
) -> Any:
    """Attend every segment chunk by chunk and stitch the rows back in order."""
    xp = problem.xp
    n_queries = sets.n_queries
    batch_heads = math.prod(problem.out_shape[:-2])
    pieces = []
    for segment in segments:
        pairs = max(1, segment.width * segment.rows_per_tile * batch_heads)
        step = query_chunk or max(1, CHUNK_PAIRS // pairs)
        for a in range(segment.start, segment.stop, step):
            rows, keys, ok = segment.make(a, min(a + step, segment.stop))
            real = rows < n_queries
            rows = xp.where(real, rows, xp.zeros_like(rows))
            keys = xp.where(ok, keys, xp.zeros_like(keys))
            allowed = xp.logical_and(
                xp.logical_and(ok[:, None, :], real[:, :, None]),
                sets.allowed(xp, rows[:, :, None], keys[:, None, :]),
            )
            pieces.append(_attend(problem, rows, keys, allowed))
    out = xp.concat(pieces, axis=-2)[..., :n_queries, :]
    return xp.astype(xp.reshape(out, problem.out_shape), problem.out_dtype, copy=False)


# --- candidate keys per pattern --------------------------------------------------------------


def _in_keys(xp: ModuleType, keys: Any, n_keys: int) -> Any:
    return xp.logical_and(keys >= 0, keys < n_keys)


def _per_key(xp: ModuleType, per_block: Any, size: int) -> Any:
    """(T, blocks) flags repeated for the ``size`` keys of each block: (T, blocks * size)."""
    tiles, blocks = per_block.shape
    expanded = xp.broadcast_to(per_block[:, :, None], (tiles, blocks, size))
    return xp.reshape(expanded, (tiles, blocks * size))


def _per_query(start: int, stop: int, width: int, make: Candidates) -> Segment:
    return Segment(start, stop, 1, width, make)


def _window_span(
    sets: SparsePattern, left: int | None, right: int | None, dilation: int, a: int, b: int
) -> tuple[int, int]:
    """Range of m with candidate key t - dilation * m for the queries a .. b - 1."""
    t_first, t_last = a + sets.offset, b - 1 + sets.offset
    high = t_last // dilation
    if left is not None:
        high = min(high, left // dilation)
    low = -((sets.n_keys - 1 - t_first) // dilation)
    if right is not None:
        low = max(low, -(right // dilation))
    if sets.causal:
        low = max(low, 0)
    return low, high


def _window_candidates(
    xp: ModuleType,
    device: Any,
    sets: SparsePattern,
    left: int | None,
    right: int | None,
    dilation: int,
    a: int,
    b: int,
) -> tuple[Any, Any]:
    low, high = _window_span(sets, left, right, dilation, a, b)
    t = xp.arange(a, b, device=device)[:, None] + sets.offset
    keys = t - dilation * xp.arange(low, max(high + 1, low), device=device)[None, :]
    return t, keys


def _dense_rows(xp: ModuleType, device: Any, sets: SparsePattern, start: int, stop: int) -> Segment:
    """Queries whose S(i) may be every key (global rows) gather all keys."""

    def make(a: int, b: int) -> tuple[Any, Any, Any]:
        rows = xp.arange(a, b, device=device)[:, None]
        keys = xp.broadcast_to(xp.arange(sets.n_keys, device=device)[None, :], (b - a, sets.n_keys))
        return rows, keys, xp.ones_like(keys, dtype=xp.bool)

    return _per_query(start, stop, sets.n_keys, make)


def _split_rows(
    n_queries: int,
    dense_rows: list[tuple[int, int]],
    sparse: Callable[[int, int], Segment],
    dense: Callable[[int, int], Segment],
) -> list[Segment]:
    """Cut 0 .. Lq - 1 into dense row ranges and the sparse ranges between them, in order."""
    segments, position = [], 0
    for start, stop in sorted((max(s, 0), min(e, n_queries)) for s, e in dense_rows):
        if start >= stop or stop <= position:
            continue
        start = max(start, position)
        if start > position:
            segments.append(sparse(position, start))
        segments.append(dense(start, stop))
        position = stop
    if position < n_queries:
        segments.append(sparse(position, n_queries))
    return segments


def _plan_window(xp: ModuleType, device: Any, sets: SlidingWindow) -> list[Segment]:
    def make(a: int, b: int) -> tuple[Any, Any, Any]:
        t, keys = _window_candidates(xp, device, sets, sets.left, sets.right, sets.dilation, a, b)
        return t - sets.offset, keys, _in_keys(xp, keys, sets.n_keys)

    low, high = _window_span(sets, sets.left, sets.right, sets.dilation, 0, sets.n_queries)
    return [_per_query(0, sets.n_queries, max(high - low + 1, 0), make)]


def _plan_strided(xp: ModuleType, device: Any, sets: Strided) -> list[Segment]:
    stride, offset = sets.stride, sets.offset

    def make(a: int, b: int) -> tuple[Any, Any, Any]:
        t = xp.arange(a, b, device=device)[:, None] + offset
        # t - l .. t, then the rest of t's residue class: t - 2l, t - 3l, … and t + l, …
        # (so no key is listed twice).
        past = (b - 1 + offset) // stride
        future = 0 if sets.causal else (sets.n_keys - 1 - a - offset) // stride
        keys = xp.concat(
            [
                t - xp.arange(stride + 1, device=device)[None, :],
                t - stride * xp.arange(2, max(past + 1, 2), device=device)[None, :],
                t + stride * xp.arange(1, max(future + 1, 1), device=device)[None, :],
            ],
            axis=1,
        )
        return t - offset, keys, _in_keys(xp, keys, sets.n_keys)

    past = (sets.n_queries - 1 + offset) // stride
    future = 0 if sets.causal else (sets.n_keys - 1 - offset) // stride
    width = stride + 1 + max(past - 1, 0) + max(future, 0)
    return [_per_query(0, sets.n_queries, width, make)]


def _plan_fixed(xp: ModuleType, device: Any, sets: Fixed) -> list[Segment]:
    stride, summary = sets.stride, sets.summary
    n_blocks = -(-sets.n_keys // stride)
    if sets.causal:
        n_blocks = min(n_blocks, max((sets.n_queries - 1 + sets.offset) // stride + 1, 0))
    summaries = xp.reshape(
        xp.arange(n_blocks, device=device)[:, None] * stride
        + xp.arange(stride - summary, stride, device=device)[None, :],
        (1, -1),
    )

    def make(a: int, b: int) -> tuple[Any, Any, Any]:
        t = xp.arange(a, b, device=device)[:, None] + sets.offset
        block = xp.floor_divide(t, stride)
        own = block * stride + xp.arange(stride, device=device)[None, :]
        others = xp.broadcast_to(summaries, (b - a, summaries.shape[1]))
        keys = xp.concat([own, others], axis=1)
        # Summary columns of the query's own block are already in `own`.
        ok = xp.concat([xp.ones_like(own, dtype=xp.bool), others // stride != block], axis=1)
        return t - sets.offset, keys, xp.logical_and(ok, _in_keys(xp, keys, sets.n_keys))

    return [_per_query(0, sets.n_queries, stride + summaries.shape[1], make)]


def _plan_block_sparse(xp: ModuleType, device: Any, sets: BlockSparse) -> list[Segment]:
    """One tile per query block: the keys of its active key blocks, gathered once."""
    layout = xp.astype(sets.layout, xp.int8)
    counts = xp.sum(layout, axis=1)
    most = int(xp.max(counts)) if counts.shape[0] else 0
    # Active key blocks first, in order; slot s of row I is active iff s < counts[I].
    active = xp.argsort(layout, axis=1, descending=True, stable=True)[:, :most]
    bq, bk = sets.block_q, sets.block_k

    def make(a: int, b: int) -> tuple[Any, Any, Any]:
        blocks = active[a:b, :]
        used = xp.arange(most, device=device)[None, :] < counts[a:b, None]
        keys = blocks[:, :, None] * bk + xp.arange(bk, device=device)[None, None, :]
        keys = xp.reshape(keys, (b - a, most * bk))
        ok = _per_key(xp, used, bk)
        rows = xp.arange(a, b, device=device)[:, None] * bq + xp.arange(bq, device=device)
        return rows, keys, xp.logical_and(ok, keys < sets.n_keys)

    return [Segment(0, layout.shape[0], bq, most * bk, make)]


def _plan_longformer(xp: ModuleType, device: Any, sets: Longformer) -> list[Segment]:
    keys_global = [g for g in sets.global_tokens if g < sets.n_keys]
    global_keys = xp.asarray(keys_global, dtype=index_dtype(xp, device), device=device)[None, :]

    def make(a: int, b: int) -> tuple[Any, Any, Any]:
        t, window = _window_candidates(xp, device, sets, sets.left, sets.right, sets.dilation, a, b)
        # A global key inside the window is already a window candidate.
        extra = xp.logical_not(in_window(xp, t - global_keys, sets.left, sets.right, sets.dilation))
        keys = xp.concat([window, xp.broadcast_to(global_keys, (b - a, len(keys_global)))], axis=1)
        ok = xp.concat([_in_keys(xp, window, sets.n_keys), extra], axis=1)
        return t - sets.offset, keys, ok

    low, high = _window_span(sets, sets.left, sets.right, sets.dilation, 0, sets.n_queries)
    width = max(high - low + 1, 0) + len(keys_global)
    dense_rows = [(g - sets.offset, g - sets.offset + 1) for g in sets.global_tokens]
    return _split_rows(
        sets.n_queries,
        dense_rows,
        lambda a, b: _per_query(a, b, width, make),
        lambda a, b: _dense_rows(xp, device, sets, a, b),
    )


def _plan_bigbird(xp: ModuleType, device: Any, sets: BigBird) -> list[Segment]:
    size, window = sets.block_size, sets.window_blocks
    table = sets.random_table(xp, device)
    within = xp.arange(size, device=device)
    global_blocks = xp.asarray(sets.global_blocks, dtype=table.dtype, device=device)

    def block_keys(blocks: Any) -> Any:
        keys = blocks[:, :, None] * size + within[None, None, :]
        return xp.reshape(keys, (blocks.shape[0], blocks.shape[1] * size))

    def make(a: int, b: int) -> tuple[Any, Any, Any]:
        t = xp.arange(a, b, device=device)[:, None] + sets.offset
        query_block = xp.floor_divide(t, size)
        near = query_block + xp.arange(-window, window + 1, device=device)[None, :]
        far = xp.broadcast_to(global_blocks[None, :], (b - a, global_blocks.shape[0]))
        drawn = xp.take(table, xp.reshape(query_block - sets.first_block, (-1,)), axis=0)
        keys = xp.concat([block_keys(near), block_keys(far), block_keys(drawn)], axis=1)
        # Global blocks inside the window are window candidates already; -1 = not drawn.
        far_ok = xp.abs(far - query_block) > window
        ok = xp.concat([xp.ones_like(near, dtype=xp.bool), far_ok, drawn >= 0], axis=1)
        ok = _per_key(xp, ok, size)
        return t - sets.offset, keys, xp.logical_and(ok, _in_keys(xp, keys, sets.n_keys))

    width = (2 * window + 1 + len(sets.global_blocks) + table.shape[1]) * size
    dense_rows = [
        (g * size - sets.offset, (g + 1) * size - sets.offset) for g in sets.global_blocks
    ]
    return _split_rows(
        sets.n_queries,
        dense_rows,
        lambda a, b: _per_query(a, b, width, make),
        lambda a, b: _dense_rows(xp, device, sets, a, b),
    )


_PLANNERS: dict[type, Callable[[ModuleType, Any, Any], list[Segment]]] = {
    SlidingWindow: _plan_window,
    Strided: _plan_strided,
    Fixed: _plan_fixed,
    BlockSparse: _plan_block_sparse,
    Longformer: _plan_longformer,
    BigBird: _plan_bigbird,
}


def plan(sets: SparsePattern, xp: ModuleType, device: Any) -> list[Segment]:
    """The segments of candidate keys that cover every query of ``sets``, in row order."""
    return _PLANNERS[type(sets)](xp, device, sets)


# Why this signature parallels sparse_mask's: both take a pattern's open parameters as
# **params, so their placement keywords stay explicit instead of a **placement set.
def sparse_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    pattern: str,
    alignment: str = "top_left",
    causal: bool = False,
    scale: float | None = None,
    query_chunk: int | None = None,
    **params: Any,
) -> Array:
    """Attention restricted to a spec pattern, computing only the allowed pairs.

    Equals ``scaled_dot_product_attention(q, k, v, mask=sparse_mask(pattern, Lq, Lk,
    alignment=..., causal=..., **params), scale=scale)`` within TOL-2, with weights of
    masked-out keys exactly 0 and masked-out keys and values never read (SPARSE-6).
    Layout, scale, GQA and empty rows as in spec/dense.md.  ``query_chunk`` (tiles per
    step; default: about :data:`CHUNK_PAIRS` query-key pairs over all batch elements and
    heads) only trades memory for Python overhead.
    """
    call = f"sparse_attention(q, k, v, pattern={pattern!r})"
    problem = prepare(q, k, v, scale=scale, call=call)
    if query_chunk is not None:
        query_chunk = check_size("query_chunk", query_chunk, call, minimum=1)
    xp = problem.xp
    device = array_api_compat.device(q)
    n_queries, n_keys = problem.q.shape[-2], problem.k.shape[-2]
    at = Placement(alignment=alignment, causal=causal, xp=xp, device=device)
    sets = build_pattern(pattern, n_queries, n_keys, params, call, at)
    if n_queries == 0 or n_keys == 0:
        return xp.zeros(problem.out_shape, dtype=problem.out_dtype, device=device)
    return _run(problem, sets, plan(sets, xp, device), query_chunk)


def block_sparse_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    layout: Any,
    block_size: int | tuple[int, int],
    scale: float | None = None,
    query_chunk: int | None = None,
) -> Array:
    """Block-sparse attention for any boolean block ``layout`` (SPARSE-4.1).

    Query block I (rows ``I*bq .. I*bq + bq - 1``) attends the keys of the key blocks J
    with ``layout[I, J]``; ``block_size`` is b or ``(bq, bk)`` and the last blocks may be
    ragged.  Keys and values are gathered once per query block.
    """
    return sparse_attention(
        q,
        k,
        v,
        pattern="block_sparse",
        layout=layout,
        block_size=block_size,
        scale=scale,
        query_chunk=query_chunk,
    )
