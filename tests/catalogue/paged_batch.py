"""Paged-batch kernels (PAGED-1 … PAGED-7) as serving stacks write them, in NumPy: correct
formulations and the bugs that real paged kernels had.

Every kernel is ``fn(q (T, Hq, E), k_cache, v_cache, *, cu_seqlens_q, seqused_k,
block_table, max_seqlen_q, max_seqlen_k, is_causal)`` -> ``(T, Hq, Ev)``, accumulating in
float32 for half-precision inputs (in the inputs' dtype otherwise), and declares its page
layout (``PagedBatchClaim``).  Rows past ``cu_seqlens_q[-1]`` are left 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from attnspec.conformance import PagedBatchClaim, declare
from attnspec.conformance.claims.family_claims import PAGED_FEATURES

from .entry import CaughtBug, required, signed

Array = np.ndarray


def _work(x: Array) -> type:
    return np.float32 if x.dtype == np.float16 else x.dtype.type


def _gather(cache: Array, row: Array, start: int, stop: int) -> Array:
    """Positions [start, stop) of one sequence, ``(Hkv, stop - start, ·)`` from HND pages."""
    page = cache.shape[2]
    positions = np.arange(start, stop)
    return np.swapaxes(cache[row[positions // page], :, positions % page], 0, 1)


class Options(NamedTuple):
    """The options of PagedBatchClaim.features as the kernel received them (FlashAttention's
    and FlashInfer's conventions: -1 and 0 mean none)."""

    cache_leftpad: Array | None = None
    window_size: tuple[int, int] = (-1, -1)
    attention_chunk: int = 0
    softcap: float = 0.0
    custom_mask: Array | None = None
    sinks: Array | None = None
    n_sink_tokens: int = 0


def visible(
    n_q: int, n_k: int, offset: int, is_causal: bool, options: Options, origin: int = 0
) -> Array:
    """(Lq, Lk): query i at key position i + offset sees key j by the causal rule, the
    window (left, right) with the first ``n_sink_tokens`` keys spared by its left side,
    and the chunk (counted from position ``origin``), each written out on its own."""
    i, j = np.arange(n_q)[:, None] + offset, np.arange(n_k)[None, :]
    allowed = np.ones((n_q, n_k), bool)
    left, right = options.window_size
    if is_causal or options.attention_chunk:
        allowed &= j <= i
    elif right >= 0:
        allowed &= j <= i + right
    if left >= 0:
        allowed &= (j >= i - left) | (j < options.n_sink_tokens)
    if options.attention_chunk:
        chunk = options.attention_chunk
        allowed &= np.floor_divide(j - origin, chunk) == np.floor_divide(i - origin, chunk)
    return allowed


def _attend(
    q: Array,
    k: Array,
    v: Array,
    allowed: Array | None,
    softcap: float = 0.0,
    sinks: Array | None = None,
) -> Array:
    """One sequence: ``q (Lq, Hq, E)`` against ``k, v (Hkv, Lk, ·)`` where ``allowed
    (Lq, Lk)`` (None: everywhere), scores softcapped by ``softcap`` (0: none), each head's
    sink logit (``sinks (Hq,)``) one more term of the denominator without a value; rows
    without keys give 0."""
    work = _work(q)
    n_q_heads, n_kv_heads = q.shape[1], k.shape[0]
    k = np.repeat(k, n_q_heads // n_kv_heads, axis=0).astype(work)
    v = np.repeat(v, n_q_heads // n_kv_heads, axis=0).astype(work)
    scores = np.swapaxes(q.astype(work), 0, 1) @ np.swapaxes(k, 1, 2) * work(q.shape[-1] ** -0.5)
    if softcap:
        scores = work(softcap) * np.tanh(scores / work(softcap))
    if allowed is not None:
        scores = np.where(allowed, scores, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
    sink = None if sinks is None else np.asarray(sinks, work)[:, None, None]
    if sink is not None:
        top = np.maximum(top, sink)
    exps = np.exp(scores - np.where(top == -np.inf, 0, top))
    total = exps.sum(-1, keepdims=True)
    if sink is not None:
        total = total + np.exp(sink - top)
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
    options: Options = Options()

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> PagedCall:
        """The call of these arguments by name, the features' in ``options``."""
        options = Options(**{name: arguments[name] for name in Options._fields})
        return cls(
            **{name: arguments[name] for name in cls._fields if name != "options"}, options=options
        )

    def mask(self, b: int, n_q: int, n_k: int, offset: int = 0) -> Array | None:
        """Sequence b's ``(n_q, n_k)`` entries of custom_mask, from element ``offset`` on
        (PAGED-8: the sum of the earlier sequences' L_q * L_k); None without a mask."""
        if self.options.custom_mask is None:
            return None
        return np.asarray(self.options.custom_mask)[offset : offset + n_q * n_k].reshape(n_q, n_k)


# PAGED-1's signature: the positional arrays, the keywords without a default, and every
# keyword (the features' with their defaults, as :class:`Options` has them)
PAGED_ARRAYS = ("q", "k_cache", "v_cache")
PAGED_REQUIRED = required(
    "cu_seqlens_q", "seqused_k", "block_table", "max_seqlen_q", "max_seqlen_k"
)
PAGED_KEYWORDS = MappingProxyType({**PAGED_REQUIRED, "is_causal": False, **Options._field_defaults})


def paged_kernel(
    claim: PagedBatchClaim | None = None,
) -> Callable[[Callable[[PagedCall], Array]], Callable[..., Array]]:
    """A decorator: ``body(call)`` as a kernel with the spec's paged-batch signature
    (:data:`PAGED_KEYWORDS`, written once by :func:`~catalogue.entry.signed`) declaring
    ``claim`` (default: HND pages) and grouped-query heads; it keeps ``body``'s name,
    docstring and module, by which reports show it and worker processes load it."""

    def make(body: Callable[[PagedCall], Array]) -> Callable[..., Array]:
        kernel = signed(PAGED_KEYWORDS, PAGED_ARRAYS, PagedCall.of)(body)
        claim_ = PagedBatchClaim() if claim is None else claim
        return declare(kernel, paged_batch=claim_, gqa=True)

    return make


def _check_metadata(call: PagedCall) -> None:
    """PAGED-6: offsets, lengths and the pages read, as a kernel validates them before
    launching (PAGED-1's conditions); ValueError naming what is wrong."""
    offsets, used = np.asarray(call.cu_seqlens_q), np.asarray(call.seqused_k)
    table, (n_pages, _, page) = np.asarray(call.block_table), call.k_cache.shape[:3]
    pad = call.options.cache_leftpad
    pad = np.zeros_like(used) if pad is None else np.asarray(pad)
    if offsets.ndim != 1 or len(offsets) != len(used) + 1 or len(table) != len(used):
        raise ValueError(f"cu_seqlens_q has {len(offsets)} entries for {len(used)} sequences")
    if offsets[0] != 0 or (np.diff(offsets) < 0).any() or offsets[-1] > call.q.shape[0]:
        raise ValueError(f"cu_seqlens_q={offsets.tolist()} is not well-formed")
    if ((pad < 0) | (pad > used) | (used > table.shape[1] * page)).any():
        raise ValueError(f"seqused_k={used.tolist()} past the capacity or below cache_leftpad")
    for b, (start, stop) in enumerate(zip(pad, used, strict=True)):
        pages = table[b, start // page : -(-stop // page)] if stop > start else table[b, :0]
        if ((pages < 0) | (pages >= n_pages)).any():
            raise ValueError(f"block_table[{b}] reads pages outside [0, {n_pages})")


def _paged(
    call: PagedCall,
    *,
    table: Callable[[int], Array] | None = None,
    keys_read: Callable[[int], int] | None = None,
    offset: Callable[[int, int, int], int] | None = None,
    first_key: Callable[[int], int] | None = None,
    window_offset: Callable[[int, int, int], int] | None = None,
    chunk_origin: Callable[[int, int], int] | None = None,
    mask_offset: Callable[[int, int], int] | None = None,
    sinks: Callable[[], Array | None] | None = None,
    gather: Callable[[Array, Array, int, int], Array] = _gather,
) -> Array:
    """The correct kernel, with hooks a bug replaces: the table row, the number of
    positions read, the causal offset of (sequence, L_q, L_k), the first position read,
    the offset the window and chunk are measured with, the position chunks are counted
    from (of L_q, L_k), and where sequence b's mask starts (of (b, the correct start))."""
    if table is None:  # a bug that replaces the table validates nothing
        _check_metadata(call)
    q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, _, _, is_causal, options = call
    out = np.zeros(q.shape[:2] + v_cache.shape[-1:], q.dtype)
    mask_start = 0
    for b in range(len(seqused_k)):
        first, last = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        row = block_table[b] if table is None else table(b)
        n_keys = int(seqused_k[b]) if keys_read is None else keys_read(b)
        pad = options.cache_leftpad
        start = (0 if pad is None else int(pad[b])) if first_key is None else first_key(b)
        k, v = gather(k_cache, row, start, n_keys), gather(v_cache, row, start, n_keys)
        n_q, n_k = last - first, n_keys - start
        shift = n_k - n_q if offset is None else offset(b, n_q, n_k)
        origin = 0 if chunk_origin is None else chunk_origin(n_q, n_k)
        if window_offset is None:
            allowed = visible(n_q, n_k, shift, is_causal, options, origin)
        else:  # the causal rule from shift, the window and chunk from another offset
            causal = visible(n_q, n_k, shift, is_causal, Options())
            windowed = visible(n_q, n_k, window_offset(b, n_q, n_k), False, options)
            allowed = causal & windowed
        at = mask_start if mask_offset is None else mask_offset(b, mask_start)
        mask = call.mask(b, n_q, n_k, at)
        if mask is not None:
            allowed = allowed & mask
        mask_start += n_q * n_k
        sink = options.sinks if sinks is None else sinks()
        out[first:last] = _attend(q[first:last], k, v, allowed, options.softcap, sink).astype(
            q.dtype
        )
    return out


EVERY_FEATURE = PagedBatchClaim(features=PAGED_FEATURES)


@paged_kernel(EVERY_FEATURE)
def paged_gather(call: PagedCall) -> Array:
    """Each sequence's positions gathered through its block table from its cache_leftpad,
    then dense attention with its window, chunk, softcap and mask."""
    return _paged(call)


@paged_kernel(PagedBatchClaim(cache_layout="nhd", features=PAGED_FEATURES))
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
    q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table, _, _, is_causal, _ = call
    page = k_cache.shape[2]
    out = np.zeros(q.shape[:2] + v_cache.shape[-1:], q.dtype)
    for b in range(len(seqused_k)):
        first, last = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        n_keys = int(seqused_k[b])
        k = _gather(k_cache, block_table[b], 0, n_keys)
        v = _gather(v_cache, block_table[b], 0, -(-n_keys // page) * page)  # the whole page
        n_q = last - first
        allowed = visible(n_q, n_keys, n_keys - n_q, is_causal, Options())
        rows = _attend(q[first:last], k, v[:, :n_keys], allowed)
        group = q.shape[1] // v.shape[0]
        with np.errstate(invalid="ignore"):  # the padding slots' weight 0 times their values
            leaked = np.repeat(0 * v[:, n_keys:].sum(axis=1), group, axis=0)  # (Hq, Ev)
        out[first:last] = (rows + leaked[None]).astype(q.dtype)
    return out


@paged_kernel(PagedBatchClaim(features=("window", "chunk")))
def paged_window_from_cache_start(call: PagedCall) -> Array:
    """Bug: the causal rule bottom-right, but the window and the chunk measured from query
    positions counted from the cache's first position (t_i = i), so a prefill chunk or a
    decode row at the end of a long cache sees keys far outside its window."""
    return _paged(call, window_offset=lambda b, n_queries, n_keys: 0)


@paged_kernel(PagedBatchClaim(features=("chunk",)))
def paged_chunk_from_first_query(call: PagedCall) -> Array:
    """Bug: chunks counted from the sequence's first query position instead of key position
    0 (CHUNK-1's rationale), right only where L_k - L_q is a multiple of the chunk."""

    return _paged(call, chunk_origin=lambda n_queries, n_keys: n_keys - n_queries)


@paged_kernel(PagedBatchClaim(features=("leftpad",)))
def paged_ignores_leftpad(call: PagedCall) -> Array:
    """Bug: cache_leftpad ignored: every sequence read from logical position 0 of its block
    table, the padding slots before the first valid position attended."""
    return _paged(call, first_key=lambda b: 0)


@paged_kernel(PagedBatchClaim(features=("mask",)))
def paged_mask_at_query_offset(call: PagedCall) -> Array:
    """Bug: sequence b's custom_mask entries read from cu_seqlens_q[b] * L_k,b instead of the
    sum of the earlier sequences' L_q * L_k: right only where every sequence has the same
    number of keys."""

    def mask_offset(b: int, start: int) -> int:
        n_queries = int(call.cu_seqlens_q[b + 1] - call.cu_seqlens_q[b])
        n_keys = int(call.seqused_k[b])
        size = np.asarray(call.options.custom_mask).size
        # kept within the mask, as a kernel reading its own buffer would be
        return min(int(call.cu_seqlens_q[b]) * n_keys, size - n_queries * n_keys)

    return _paged(call, mask_offset=mask_offset)


@paged_kernel(PagedBatchClaim(features=("window", "sinks")))
def paged_sinks_dropped_with_window(call: PagedCall) -> Array:
    """Bug: the sink logits dropped where a sliding window applies (a separate windowed path
    that never learned about sinks), one of the ways issue 32 lists to get SINK-1 wrong."""
    windowed = call.options.window_size != (-1, -1)
    return _paged(call, sinks=lambda: None if windowed else call.options.sinks)


def _gather_int16(cache: Array, row: Array, start: int, stop: int) -> Array:
    """:func:`_gather` through each position's flat slot index, page * P + slot, held in
    16 bits: past 2**15 slots it wraps to a negative index, which reads from the pool's
    end."""
    page = cache.shape[2]
    positions = np.arange(start, stop)
    flat = (row[positions // page].astype(np.int64) * page + positions % page).astype(np.int16)
    slots = np.swapaxes(cache, 1, 2).reshape(-1, *cache.shape[1:2], *cache.shape[3:])
    return np.swapaxes(slots[flat.astype(np.int64)], 0, 1)


@paged_kernel()
def paged_slot_index_int16(call: PagedCall) -> Array:
    """Bug: the flat slot index page * P + slot held in 16 bits (xformers #719's int16
    cast), so a pool of more than 2**15 positions reads the wrong slots past it: the
    32-bit form of the same arithmetic wraps past 2**31 elements (vllm-project/vllm
    #1486, fixed in #1514; FlexAttention's paged offsets, vllm #50427), a pool no CPU
    check can allocate.  Right for every pool the random draws make."""
    return _paged(call, gather=_gather_int16)


@paged_kernel()
def paged_wrapped_page_index(call: PagedCall) -> Array:
    """Bug: no metadata validated, and every page index taken modulo the pool (a guard
    against faults, or Python's negative indexing): an index past the pool or below 0
    silently reads another page, another sequence's keys (PAGED-6)."""
    n_pages = call.k_cache.shape[0]
    return _paged(call, table=lambda b: np.asarray(call.block_table[b]) % n_pages)


@paged_kernel(PagedBatchClaim(features=("sinks",)))
def paged_sinks_per_kv_head(call: PagedCall) -> Array:
    """Bug: query head h's sink logit read at its key/value head's index, sinks[h // G]
    (the sink belongs to the query head, SINK-1): right only without grouped heads."""
    sinks, group = call.options.sinks, call.q.shape[1] // call.k_cache.shape[1]

    def per_kv_head() -> Array | None:
        return None if sinks is None else np.asarray(sinks)[np.arange(call.q.shape[1]) // group]

    return _paged(call, sinks=per_kv_head)


@paged_kernel(PagedBatchClaim(features=("window", "sink_tokens")))
def paged_sink_tokens_windowed(call: PagedCall) -> Array:
    """Bug: n_sink_tokens ignored, the window applied to the sink tokens too: they are lost
    exactly once the window has moved past them, the case StreamingLLM keeps them for
    (SINK-4's rationale)."""
    return _paged(call._replace(options=call.options._replace(n_sink_tokens=0)))


@paged_kernel()
def paged_padding_rows_left(call: PagedCall) -> Array:
    """Bug: the output allocated like q and only the sequences' rows written
    (FlashAttention's torch.empty, flash-attention #1228): the rows past cu_seqlens_q[-1]
    keep what that memory held, here the padding rows of q themselves (a buffer reused)."""
    out, valid = _paged(call), int(call.cu_seqlens_q[-1])
    out[valid:] = call.q[valid:, :, : out.shape[-1]]  # the suite draws E == Ev
    return out


BUGS = (
    CaughtBug(paged_memory_order, "paged-batch-matches-reference"),
    CaughtBug(paged_whole_last_page, "paged-batch-matches-reference"),
    CaughtBug(paged_batch_alignment, "paged-batch-matches-reference"),
    CaughtBug(paged_top_left, "paged-batch-matches-reference"),
    CaughtBug(paged_nan_leak, "paged-batch-ignores-padding"),
    CaughtBug(paged_window_from_cache_start, "paged-batch-matches-reference"),
    CaughtBug(paged_chunk_from_first_query, "paged-batch-matches-reference"),
    CaughtBug(paged_ignores_leftpad, "paged-batch-matches-reference"),
    CaughtBug(paged_mask_at_query_offset, "paged-batch-matches-reference"),
    CaughtBug(paged_sinks_dropped_with_window, "paged-batch-matches-reference"),
    CaughtBug(paged_padding_rows_left, "paged-batch-padding-rows"),
    CaughtBug(paged_wrapped_page_index, "paged-batch-rejects-malformed"),
    CaughtBug(paged_slot_index_int16, "paged-batch-matches-reference"),
    CaughtBug(paged_sinks_per_kv_head, "paged-batch-matches-reference"),
    CaughtBug(paged_sink_tokens_windowed, "paged-batch-matches-reference"),
)
