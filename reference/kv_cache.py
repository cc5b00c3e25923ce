"""Attention over a KV cache, contiguous or paged (spec/features.md, KVCACHE-1 … KVCACHE-5).

In the spec's head-before-length layout: ``q (B, Hq, Lq, E)``; a contiguous cache
``k_cache (B, Hkv, L_cache, E)``, ``v_cache (B, Hkv, L_cache, Ev)``, or a paged cache
``(num_blocks, Hkv, block_size, ·)`` addressed through ``block_table (B, max_blocks)``;
``cache_seqlens (B,)``, the valid length of each batch element's cache; optional new
keys and values ``k, v (B, Hkv, L_new, ·)`` appended at position ``cache_seqlens[b]``.
The output is the dense definition on each batch element's keys, bottom-right causal
(the queries are the last Lq of its keys).  The reference is pure: the cache a kernel
leaves after appending is :func:`append_to_cache`'s result.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, TypedDict

import array_api_compat

from ._array import Array
from ._checks import check_flag, check_size, namespace_of
from .attention import scaled_dot_product_attention
from .options import FeatureOptions, SinkLogits, filled, shows_options
from .serving.paged import Rules, check_window
from .serving.sinks import attention_with_sinks

if TYPE_CHECKING:
    from typing import Unpack

CALL = "kv_cache_attention(q, k_cache, v_cache, cache_seqlens)"
APPEND = "append_to_cache(k_cache, v_cache, cache_seqlens, k, v)"


def _ints(a: Any, name: str, ndim: int, call: str) -> list[Any]:
    """An integer array of ``ndim`` dims as nested Python lists (KVCACHE-1)."""
    xp = namespace_of(call, **{name: a})
    if a.ndim != ndim or not xp.isdtype(a.dtype, "integral"):
        raise TypeError(
            f"{name} has dtype {a.dtype} and shape {tuple(a.shape)}, but should be "
            f"a {ndim}-d integer array [KVCACHE-1, {call}]"
        )
    if ndim == 1:
        return [int(a[i]) for i in range(a.shape[0])]
    return [[int(a[i, j]) for j in range(a.shape[1])] for i in range(a.shape[0])]


class CacheLayout:
    """Where each batch element's logical cache positions live (KVCACHE-1, KVCACHE-5)."""

    def __init__(
        self,
        k_cache: Array,
        v_cache: Array,
        cache_seqlens: Array,
        block_table: Array,
        n_batch: int,
        n_new: int,
        call: str,
    ) -> None:
        if k_cache.ndim != 4 or v_cache.ndim != 4 or k_cache.shape[:3] != v_cache.shape[:3]:
            raise ValueError(
                f"k_cache.shape={tuple(k_cache.shape)}, v_cache.shape="
                f"{tuple(v_cache.shape)}, but should be (B, Hkv, L_cache, E) and "
                f"(B, Hkv, L_cache, Ev), or paged (num_blocks, Hkv, block_size, ·) "
                f"[KVCACHE-1, {call}]"
            )
        self.lengths = _ints(cache_seqlens, "cache_seqlens", 1, call)
        if len(self.lengths) != n_batch:
            raise ValueError(
                f"cache_seqlens has {len(self.lengths)} entries, but should have "
                f"one per batch element ({n_batch}) [KVCACHE-1, {call}]"
            )
        self.paged = block_table is not None
        if self.paged:
            self.table = _ints(block_table, "block_table", 2, call)
            n_blocks, self.block_size = k_cache.shape[0], k_cache.shape[2]
            if len(self.table) != n_batch or any(
                not 0 <= n < n_blocks for row in self.table for n in row
            ):
                raise ValueError(
                    f"block_table={self.table}, but should have one row per batch "
                    f"element ({n_batch}) of block indices in [0, {n_blocks}) "
                    f"[KVCACHE-5, {call}]"
                )
            capacity = (len(self.table[0]) if self.table else 0) * self.block_size
        else:
            if k_cache.shape[0] != n_batch:
                raise ValueError(
                    f"k_cache.shape[0]={k_cache.shape[0]}, but should be the batch "
                    f"size {n_batch} (or pass block_table=) [KVCACHE-1, {call}]"
                )
            capacity = k_cache.shape[2]
        for b, length in enumerate(self.lengths):
            if not 0 <= length <= capacity - n_new:
                raise ValueError(
                    f"cache_seqlens[{b}]={length}, but should be in [0, "
                    f"{capacity - n_new}]: the cache holds {capacity} positions "
                    f"and {n_new} new keys are appended [KVCACHE-2, {call}]"
                )

    def logical(self, xp: ModuleType, cache: Any, b: int) -> Any:
        """Batch element ``b``'s cache as ``(Hkv, capacity, ·)``, in logical order."""
        if not self.paged:
            return cache[b, ...]
        blocks = [cache[n, ...] for n in self.table[b]]
        return xp.concat(blocks, axis=-2) if blocks else cache[0, ..., :0, :]


def _leftpad(cache_leftpad: Any, lengths: list[int]) -> list[int]:
    """Each batch element's first valid cache position, 0 <= it <= cache_seqlens[b]
    (KVCACHE-6)."""
    if cache_leftpad is None:
        return [0] * len(lengths)
    starts = _ints(cache_leftpad, "cache_leftpad", 1, CALL)
    if len(starts) != len(lengths) or any(
        not 0 <= s <= n for s, n in zip(starts, lengths, strict=False)
    ):
        raise ValueError(
            f"cache_leftpad={starts}, but should have one entry per batch element with "
            f"0 <= cache_leftpad[b] <= cache_seqlens[b] = {lengths} [KVCACHE-6, {CALL}]"
        )
    return starts


def _check_new(q: Array, k: Array, v: Array, k_cache: Array, call: str) -> int:
    if (k is None) != (v is None):
        raise ValueError(
            f"k is {'None' if k is None else 'given'} and v is "
            f"{'None' if v is None else 'given'}, but should both be given or "
            f"both None [KVCACHE-4, {call}]"
        )
    if k is None:
        return 0
    if (
        k.ndim != 4
        or v.ndim != 4
        or k.shape[:3] != v.shape[:3]
        or k.shape[0] != q.shape[0]
        or k.shape[1] != k_cache.shape[1]
    ):
        raise ValueError(
            f"k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}, but should be "
            f"(B, Hkv, L_new, E) and (B, Hkv, L_new, Ev) with B = {q.shape[0]} and "
            f"Hkv = {k_cache.shape[1]} [KVCACHE-4, {call}]"
        )
    return int(k.shape[2])


class _New(TypedDict, total=False):
    """The new keys and values, the block table of a paged cache (KVCACHE-1), the causal
    rule (bottom-right, KVCACHE-6) and the scale."""

    k: Array
    v: Array
    block_table: Array
    is_causal: bool
    scale: float | None


class KvCacheOptions(_New, FeatureOptions, SinkLogits, total=False):
    """``kv_cache_attention``'s keywords."""

    cache_leftpad: Array
    window: tuple[int | None, int | None]
    attention_chunk: int | None
    n_sink_tokens: int
    return_lse: bool


@shows_options(KvCacheOptions)
def kv_cache_attention(
    q: Array, k_cache: Array, v_cache: Array, cache_seqlens: Array, **given: Unpack[KvCacheOptions]
) -> Any:
    """Attention of ``q`` over each batch element's cached keys and the new ones (KVCACHE-2).

    Batch element b sees its cache positions ``cache_leftpad[b]`` (0 when absent) …
    ``cache_seqlens[b] - 1`` followed by its ``L_new`` new keys; causal calls, ALiBi, the
    ``window (left, right)`` (SPARSE-2.1) and ``attention_chunk`` (CHUNK-1) are bottom-right
    with L_k = cache_seqlens[b] - cache_leftpad[b] + L_new (KVCACHE-6), and the first
    ``n_sink_tokens`` of those keys (from ``cache_leftpad[b]``) stay visible beside the
    window (SINK-4); ``sinks (Hq,)``
    join every row's denominator (SINK-6; a row that sees no key gives 0 and
    ``lse = sinks[h]``).  Returns ``out (B, Hq, Lq, Ev)``, or ``(out, lse)`` with
    ``lse (B, Hq, Lq)``.
    """
    options = filled(KvCacheOptions, given)
    k, v, alibi_slopes = options["k"], options["v"], options["alibi_slopes"]
    cache_leftpad, attention_chunk = options["cache_leftpad"], options["attention_chunk"]
    xp = namespace_of(
        CALL,
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        k=k,
        v=v,
        alibi_slopes=alibi_slopes,
        cache_leftpad=cache_leftpad,
        sinks=options["sinks"],
    )
    return_lse = check_flag("return_lse", options["return_lse"], CALL)
    chunk = (
        None
        if attention_chunk is None
        else check_size("attention_chunk", attention_chunk, CALL, minimum=1)
    )
    n_sink_tokens = check_size("n_sink_tokens", options["n_sink_tokens"] or 0, CALL)
    window = check_window(options["window"], CALL)
    rules = Rules(options["is_causal"], *window, chunk, n_sink_tokens)
    if q.ndim != 4:
        raise ValueError(
            f"q.shape={tuple(q.shape)}, but should be (B, Hq, Lq, E) [KVCACHE-1, {CALL}]"
        )
    n_new = _check_new(q, k, v, k_cache, CALL)
    block_table = options["block_table"]
    layout = CacheLayout(k_cache, v_cache, cache_seqlens, block_table, q.shape[0], n_new, CALL)
    starts = _leftpad(cache_leftpad, layout.lengths)
    device = array_api_compat.device(q)
    outs, lses = [], []
    for b, length in enumerate(layout.lengths):
        keys = layout.logical(xp, k_cache, b)[..., starts[b] : length, :]
        values = layout.logical(xp, v_cache, b)[..., starts[b] : length, :]
        if n_new:
            keys = xp.concat([keys, k[b, ...]], axis=-2)
            values = xp.concat([values, v[b, ...]], axis=-2)
        mask = None
        if rules.left is not None or rules.right is not None or rules.chunk is not None:
            n_queries, n_keys = q.shape[2], keys.shape[-2]
            t = xp.arange(n_queries, device=device)[:, None] + (n_keys - n_queries)
            mask = rules.allowed(xp, t, xp.arange(n_keys, device=device)[None, :])
        slopes = (
            alibi_slopes if alibi_slopes is None or alibi_slopes.ndim == 1 else alibi_slopes[b, ...]
        )
        scores = dict(
            mask=mask,
            is_causal=options["is_causal"],
            causal_alignment="bottom_right",
            scale=options["scale"],
            softcap=options["softcap"],
            alibi_slopes=slopes,
        )
        out_b, lse_b = attention_with_sinks(q[b, ...], keys, values, options["sinks"], scores, CALL)
        outs.append(out_b)
        lses.append(lse_b)
    if not outs:
        out, lse = scaled_dot_product_attention(
            q, k_cache[:0, ...], v_cache[:0, ...], return_lse=True
        )
    else:
        out, lse = xp.stack(outs), xp.stack(lses)
    return (out, lse) if return_lse else out


# Alike in shape only to serving.paged._attend_rows's argument list (a run of arrays), not a
# parallel: KVCACHE-4's caches, lengths and new keys and values, then the block table.
def append_to_cache(
    k_cache: Array,
    v_cache: Array,
    cache_seqlens: Array,
    k: Array,
    v: Array,
    *,
    block_table: Array = None,
) -> tuple[Array, Array]:
    """The caches after appending ``k``, ``v`` (KVCACHE-4): batch element b's new keys at
    logical positions ``cache_seqlens[b] ... cache_seqlens[b] + L_new - 1`` (through
    ``block_table`` when paged), every other position unchanged."""
    namespace_of(APPEND, k_cache=k_cache, v_cache=v_cache, k=k, v=v)
    if k is None or v is None:
        raise ValueError(f"k and v should be arrays of new keys and values [KVCACHE-4, {APPEND}]")
    n_new = _check_new(k, k, v, k_cache, APPEND)
    layout = CacheLayout(k_cache, v_cache, cache_seqlens, block_table, k.shape[0], n_new, APPEND)
    return _written(layout, k_cache, k), _written(layout, v_cache, v)


def _written(layout: CacheLayout, cache: Any, new: Any) -> Any:
    """``cache`` with each batch element's ``new`` rows written at its length."""
    xp = array_api_compat.array_namespace(cache, new)
    n_new = new.shape[2]
    device = array_api_compat.device(cache)
    if not layout.paged:
        rows = []
        for b, length in enumerate(layout.lengths):
            rows.append(_overwrite(xp, cache[b, ...], new[b, ...], length, 0, n_new, device))
        return xp.stack(rows) if rows else cache
    blocks = [cache[n, ...] for n in range(cache.shape[0])]
    for b, length in enumerate(layout.lengths):
        for j, n in enumerate(layout.table[b]):
            blocks[n] = _overwrite(
                xp, blocks[n], new[b, ...], length, j * layout.block_size, n_new, device
            )
    return xp.stack(blocks)


def _overwrite(
    xp: ModuleType, rows: Any, new: Any, length: int, first: int, n_new: int, device: Any
) -> Any:
    """``rows (H, n, ·)`` holding logical positions ``first ... first + n - 1``, with the
    positions in ``[length, length + n_new)`` replaced by ``new`` in order."""
    if n_new == 0:
        return rows
    positions = xp.arange(first, first + rows.shape[-2], device=device)
    inside = xp.logical_and(positions >= length, positions < length + n_new)
    taken = xp.take(new, xp.clip(positions - length, 0, n_new - 1), axis=-2)
    return xp.where(inside[:, None], taken, rows)
