"""Paged-batch kernels (PAGED-1 … PAGED-7) as serving stacks write them, in NumPy: correct
formulations and the bugs that real paged kernels had.

Every kernel is ``fn(q (T, Hq, E), k_cache, v_cache, *, cu_seqlens_q, seqused_k,
block_table, max_seqlen_q, max_seqlen_k, is_causal)`` -> ``(T, Hq, Ev)``, accumulating in
float32 for half-precision inputs (in the inputs' dtype otherwise), and declares its page
layout (``PagedBatchClaim``).  Rows past ``cu_seqlens_q[-1]`` are left 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from attnspec.conformance import PagedBatchClaim, declare

from .entry import CaughtBug

Array = np.ndarray


def _work(x: Array) -> type:
    return np.float32 if x.dtype == np.float16 else x.dtype.type


def _gather(cache: Array, row: Array, start: int, stop: int) -> Array:
    """Positions [start, stop) of one sequence, ``(Hkv, stop - start, ·)`` from HND pages."""
    page = cache.shape[2]
    positions = np.arange(start, stop)
    return np.swapaxes(cache[row[positions // page], :, positions % page], 0, 1)


def _attend(q: Array, k: Array, v: Array, offset: int, is_causal: bool) -> Array:
    """One sequence: ``q (Lq, Hq, E)`` against ``k, v (Hkv, Lk, ·)``, query i at key
    position i + offset; rows without keys give 0."""
    work = _work(q)
    n_q_heads, n_kv_heads = q.shape[1], k.shape[0]
    k = np.repeat(k, n_q_heads // n_kv_heads, axis=0).astype(work)
    v = np.repeat(v, n_q_heads // n_kv_heads, axis=0).astype(work)
    scores = np.swapaxes(q.astype(work), 0, 1) @ np.swapaxes(k, 1, 2) * work(q.shape[-1] ** -0.5)
    if is_causal:
        allowed = np.arange(k.shape[1])[None, :] <= np.arange(q.shape[0])[:, None] + offset
        scores = np.where(allowed, scores, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
    exps = np.exp(scores - np.where(top == -np.inf, 0, top))
    total = exps.sum(-1, keepdims=True)
    out = (exps @ v) / np.where(total == 0, 1, total)
    return np.swapaxes(out, 0, 1)


class PagedCall(NamedTuple):
    """One call of a paged kernel in the spec's convention (PAGED-1)."""

    q: Array
    k_cache: Array
    v_cache: Array
    cu_seqlens_q: Array
    seqused_k: Array
    block_table: Array
    max_seqlen_q: int
    max_seqlen_k: int
    is_causal: bool


def paged_kernel(
    claim: PagedBatchClaim | None = None,
) -> Callable[[Callable[[PagedCall], Array]], Callable[..., Array]]:
    """A decorator: ``body(call)`` as a kernel with the spec's paged-batch signature
    (written once, here) declaring ``claim`` (default: HND pages); it keeps ``body``'s
    name, docstring and module, by which reports show it and worker processes load it."""

    def make(body: Callable[[PagedCall], Array]) -> Callable[..., Array]:
        def kernel(
            q: Array,
            k_cache: Array,
            v_cache: Array,
            *,
            cu_seqlens_q: Array,
            seqused_k: Array,
            block_table: Array,
            max_seqlen_q: int,
            max_seqlen_k: int,
            is_causal: bool = False,
        ) -> Array:
            return body(
                PagedCall(
                    q,
                    k_cache,
                    v_cache,
                    cu_seqlens_q,
                    seqused_k,
                    block_table,
                    max_seqlen_q,
                    max_seqlen_k,
                    is_causal,
                )
            )

        kernel.__name__, kernel.__qualname__ = body.__name__, body.__qualname__
        kernel.__doc__, kernel.__module__ = body.__doc__, body.__module__
        return declare(kernel, paged_batch=PagedBatchClaim() if claim is None else claim)

    return make


def _paged(
    call: PagedCall,
    *,
    table: Callable[[int], Array] | None = None,
    keys_read: Callable[[int], int] | None = None,
    offset: Callable[[int, int, int], int] | None = None,
) -> Array:
    """The correct kernel, with hooks a bug replaces: the table row, the number of
    positions read, and the causal offset of (sequence, L_q, L_k)."""
    q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, _, _, is_causal = call
    out = np.zeros(q.shape[:2] + v_cache.shape[-1:], q.dtype)
    for b in range(len(seqused_k)):
        first, last = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        row = block_table[b] if table is None else table(b)
        n_keys = int(seqused_k[b]) if keys_read is None else keys_read(b)
        k, v = _gather(k_cache, row, 0, n_keys), _gather(v_cache, row, 0, n_keys)
        shift = n_keys - (last - first) if offset is None else offset(b, last - first, n_keys)
        out[first:last] = _attend(q[first:last], k, v, shift, is_causal).astype(q.dtype)
    return out


@paged_kernel()
def paged_gather(call: PagedCall) -> Array:
    """Each sequence's positions gathered through its block table, then dense attention."""
    return _paged(call)


@paged_kernel(PagedBatchClaim(cache_layout="nhd"))
def paged_gather_nhd(call: PagedCall) -> Array:
    """vLLM's page layout ``(N, P, Hkv, E)``."""
    k_cache, v_cache = np.swapaxes(call.k_cache, 1, 2), np.swapaxes(call.v_cache, 1, 2)
    return _paged(call._replace(k_cache=k_cache, v_cache=v_cache))


CORRECT = (paged_gather, paged_gather_nhd)


@paged_kernel()
def paged_memory_order(call: PagedCall) -> Array:
    """Bug: sequence b's pages read as b*M, b*M + 1, ... (the table ignored): right only
    where the allocator hands out pages in order."""
    width = call.block_table.shape[1]
    n_pages = call.k_cache.shape[0]

    def table(b: int) -> Array:
        return (np.arange(width) + b * width) % n_pages

    return _paged(call, table=table)


@paged_kernel()
def paged_whole_last_page(call: PagedCall) -> Array:
    """Bug: the partial last page read whole, its stale slots attended."""
    page = call.k_cache.shape[2]

    def keys_read(b: int) -> int:
        return -(-int(call.seqused_k[b]) // page) * page

    return _paged(call, keys_read=keys_read)


@paged_kernel()
def paged_batch_alignment(call: PagedCall) -> Array:
    """Bug: every sequence aligned with the batch's largest lengths, max_seqlen_k -
    max_seqlen_q, so one sequence's lengths move another's causal boundary."""

    def offset(b: int, n_queries: int, n_keys: int) -> int:
        return call.max_seqlen_k - call.max_seqlen_q

    return _paged(call, offset=offset)


@paged_kernel()
def paged_top_left(call: PagedCall) -> Array:
    """Bug: causal rows aligned top-left, so a prefill chunk's queries miss the cached
    prefix's newest keys."""
    return _paged(call, offset=lambda b, n_queries, n_keys: 0)


@paged_kernel()
def paged_nan_leak(call: PagedCall) -> Array:
    """Bug: the last page read whole with the slots past the length masked by a weight of
    0, so NaN there gives 0 * NaN = NaN (Dao-AILab/flash-attention #1745, #2374)."""
    q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, _, _, is_causal = call
    page = k_cache.shape[2]
    out = np.zeros(q.shape[:2] + v_cache.shape[-1:], q.dtype)
    for b in range(len(seqused_k)):
        first, last = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        n_keys = int(seqused_k[b])
        k = _gather(k_cache, block_table[b], 0, n_keys)
        v = _gather(v_cache, block_table[b], 0, -(-n_keys // page) * page)  # the whole page
        rows = _attend(q[first:last], k, v[:, :n_keys], n_keys - (last - first), is_causal)
        group = q.shape[1] // v.shape[0]
        with np.errstate(invalid="ignore"):  # the padding slots' weight 0 times their values
            leaked = np.repeat(0 * v[:, n_keys:].sum(axis=1), group, axis=0)  # (Hq, Ev)
        out[first:last] = (rows + leaked[None]).astype(q.dtype)
    return out


BUGS = (
    CaughtBug(paged_memory_order, "paged-batch-matches-reference"),
    CaughtBug(paged_whole_last_page, "paged-batch-matches-reference"),
    CaughtBug(paged_batch_alignment, "paged-batch-matches-reference"),
    CaughtBug(paged_top_left, "paged-batch-matches-reference"),
    CaughtBug(paged_nan_leak, "paged-batch-ignores-padding"),
)
