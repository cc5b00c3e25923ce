"""Mixed prefill and decode batches over a paged cache (spec/serving.md, PAGED-1 … PAGED-7).

``q (T_q, Hq, E)`` packs the queries of B sequences (``cu_seqlens_q``); the cache is
``k_cache (N, Hkv, P, E)``, ``v_cache (N, Hkv, P, Ev)`` of N pages of P positions, read
through ``block_table (B, M)``; sequence b's keys are its logical positions
``cache_leftpad[b] … seqused_k[b] - 1``, its queries the last of them (bottom-right).

Each sequence is computed on its own from positions: its queries in chunks of rows, and for
each chunk only the keys some row of it may attend, gathered page by page and split into
blocks whose partial states are merged (MERGE-1), so memory is bounded by the chunk and
block sizes, not by the sequence's length.  Nothing outside a sequence's valid positions is
ever read (PAGED-5): cache slots and rows past the lengths cannot reach the output.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import array_api_compat

from .._array import Array
from .._checks import check_flag, check_scale, check_size, namespace_of, require_real_floating
from ..attention import scaled_dot_product_attention
from ..sdpa import compute_dtype
from ..sparse.definition import in_window, index_dtype
from ..varlen import sequence_masks
from .chunked import in_chunk
from .merge import merge_attention_states
from .mla import check_value_dim
from .sinks import check_sinks, with_sinks

CALL = "paged_attention(q, k_cache, v_cache, cu_seqlens_q, seqused_k, block_table)"
# Elements of one (heads x rows x keys) score block; as the dense tolerance's chunks.
BLOCK_ELEMENTS = 2**20


def _int_list(a: Any, name: str, ndim: int) -> list[Any]:
    """An integer array of ``ndim`` (1 or 2) dims as (nested) Python lists (PAGED-1)."""
    xp = namespace_of(CALL, **{name: a})
    if a.ndim != ndim or not xp.isdtype(a.dtype, "integral"):
        raise TypeError(
            f"{name} has dtype {a.dtype} and shape {tuple(a.shape)}, but should be a "
            f"{ndim}-d integer array [PAGED-1, {CALL}]"
        )
    # one device-to-host transfer, then plain ints
    values = [int(x) for x in xp.reshape(a, (-1,))] if a.size else []
    if ndim == 1:
        return values
    width = a.shape[1]
    return [values[row * width : (row + 1) * width] for row in range(a.shape[0])]


@dataclass(frozen=True)
class Rules:
    """Which keys each query sees, beyond its sequence (PAGED-2): causal, a window
    ``(left, right)`` (None: unbounded), a chunk size (CHUNK-1), and the sink tokens: the
    first ``sink_tokens`` keys, which the window's left bound does not hide (SINK-4)."""

    is_causal: bool
    left: int | None
    right: int | None
    chunk: int | None
    sink_tokens: int = 0

    def key_range(self, first: int, last: int, n_keys: int) -> tuple[int, int]:
        """The keys ``[lo, hi)`` that rows at positions ``first … last`` may attend."""
        lo, hi = 0, n_keys
        if self.is_causal or self.chunk is not None:
            hi = min(hi, last + 1)
        elif self.right is not None:
            hi = min(hi, last + self.right + 1)
        if self.left is not None and not self.sink_tokens:
            lo = max(lo, first - self.left)
        if self.chunk is not None:
            lo = max(lo, (first // self.chunk) * self.chunk)
        return lo, max(lo, hi)

    def allowed(self, xp: ModuleType, t: Array, j: Array) -> Array:
        """True where key position j is in S(i) for query position t (broadcasting)."""
        right = None if self.is_causal else self.right
        allowed = in_window(xp, t - j, self.left, right, 1)
        if self.sink_tokens:  # SINK-4: the window's left bound spares the sink tokens
            sinks = xp.logical_and(j < self.sink_tokens, in_window(xp, t - j, None, right, 1))
            allowed = xp.logical_or(allowed, sinks)
        if self.is_causal:
            allowed = xp.logical_and(allowed, j <= t)
        if self.chunk is not None:
            allowed = xp.logical_and(allowed, in_chunk(xp, t, j, self.chunk))
        return allowed


def check_window(window: Any, call: str = CALL) -> tuple[int | None, int | None]:
    """``window`` as ``(left, right)``, each an int >= 0 or None (SPARSE-2.1)."""
    if not isinstance(window, tuple) or len(window) != 2:
        raise TypeError(
            f"window={window!r}, but should be a tuple (left, right) of ints >= 0 or None "
            f"[SPARSE-2.1, {call}]"
        )
    left, right = (
        None if w is None else check_size(name, w, call)
        for name, w in zip(("window[0]", "window[1]"), window, strict=True)
    )
    return left, right


class _Cache:
    """Sequence b's logical positions, read page by page (PAGED-1)."""

    def __init__(
        self,
        xp: ModuleType,
        k_cache: Any,
        v_cache: Any,
        value_dim: int | None,
        table: list[list[int]],
    ) -> None:
        self.xp, self.k_cache, self.v_cache, self.value_dim = xp, k_cache, v_cache, value_dim
        self.table, self.page = table, k_cache.shape[2]
        self.device = array_api_compat.device(k_cache)

    def read(self, b: int, start: int, stop: int, work: Any) -> tuple[Any, Any]:
        """Keys ``(Hkv, stop - start, E)`` and values at logical positions [start, stop)."""
        xp, page = self.xp, self.page
        pages = self.table[b][start // page : (stop - 1) // page + 1] if stop > start else []
        index = xp.asarray(pages, dtype=index_dtype(xp, self.device), device=self.device)
        offset = start - (start // page) * page

        def gather(cache: Any) -> Any:
            taken = xp.take(cache, index, axis=0)  # (n, Hkv, P, ·), only the pages read
            n, heads, _, width = taken.shape
            rows = xp.reshape(xp.permute_dims(taken, (1, 0, 2, 3)), (heads, n * page, width))
            return xp.astype(rows[:, offset : offset + max(0, stop - start), :], work)

        keys = gather(self.k_cache)
        if self.v_cache is None:
            return keys, keys[..., : self.value_dim]
        return keys, gather(self.v_cache)


@dataclass(frozen=True)
class Sequences:
    """The batch's metadata as Python ints (PAGED-1): query offsets, each sequence's
    first and past-the-last valid cache positions, and its block table row."""

    offsets: list[int]
    starts: list[int]
    ends: list[int]
    table: list[list[int]]


def _check_sequences(
    cu_seqlens_q: Any,
    seqused_k: Any,
    block_table: Any,
    cache_leftpad: Any,
    n_tokens: int,
    n_pages: int,
    page_size: int,
) -> Sequences:
    """PAGED-1 and PAGED-6: offsets, lengths and the pages each sequence reads."""
    offsets = _int_list(cu_seqlens_q, "cu_seqlens_q", 1)
    if (
        not offsets
        or offsets[0] != 0
        or offsets[-1] > n_tokens
        or any(b < a for a, b in itertools.pairwise(offsets))
    ):
        raise ValueError(
            f"cu_seqlens_q={offsets}, but should start at 0, be non-decreasing and end at "
            f"most at the number of packed query rows, {n_tokens} [PAGED-1, {CALL}]"
        )
    n_seqs = len(offsets) - 1
    ends = _int_list(seqused_k, "seqused_k", 1)
    starts = [0] * n_seqs if cache_leftpad is None else _int_list(cache_leftpad, "cache_leftpad", 1)
    table = _int_list(block_table, "block_table", 2)
    if len(ends) != n_seqs or len(starts) != n_seqs or len(table) != n_seqs:
        raise ValueError(
            f"seqused_k has {len(ends)} entries, cache_leftpad {len(starts)} and block_table "
            f"{len(table)} rows, but each should have one per sequence ({n_seqs}) "
            f"[PAGED-1, {CALL}]"
        )
    capacity = (len(table[0]) if table else 0) * page_size
    for b in range(n_seqs):
        if not 0 <= starts[b] <= ends[b] <= capacity:
            raise ValueError(
                f"cache_leftpad[{b}]={starts[b]}, seqused_k[{b}]={ends[b]}, but should satisfy "
                f"0 <= cache_leftpad <= seqused_k <= {capacity}, the positions of a block_table "
                f"row [PAGED-6, {CALL}]"
            )
        # only the pages holding positions [start, end) are read (PAGED-1)
        first, stop = starts[b] // page_size, -(-ends[b] // page_size)
        bad = [n for n in table[b][first:stop] if not 0 <= n < n_pages]
        if ends[b] > starts[b] and bad:
            raise ValueError(
                f"block_table[{b}] reads pages {bad}, but page indices should be in "
                f"[0, {n_pages}) [PAGED-6, {CALL}]"
            )
    return Sequences(offsets, starts, ends, table)


def _check_arrays(
    xp: ModuleType,
    q: Any,
    k_cache: Any,
    v_cache: Any,
    value_dim: Any,
    alibi_slopes: Any,
    sinks: Any,
) -> int | None:
    """PAGED-1 (shapes), MLA-1 (a latent cache), SDPA-6.2, ALIBI-1, SINK-1; returns the
    checked ``value_dim`` where the values are the key cache's leading channels."""
    require_real_floating(xp, CALL, "SDPA-1.4", q=q, k_cache=k_cache, v_cache=v_cache)
    if q.ndim != 3 or k_cache.ndim != 4 or k_cache.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"q.shape={tuple(q.shape)}, k_cache.shape={tuple(k_cache.shape)}, but should be "
            f"(T_q, Hq, E) and (num_pages, Hkv, page_size, E) [PAGED-1, {CALL}]"
        )
    n_q_heads, n_kv_heads = q.shape[1], k_cache.shape[1]
    if n_kv_heads == 0 or n_q_heads % n_kv_heads != 0:
        raise ValueError(
            f"q has {n_q_heads} heads and the cache {n_kv_heads}; the query heads should be "
            f"a whole multiple of the key/value heads [SDPA-6.2, {CALL}]"
        )
    if sinks is not None:
        check_sinks(xp, sinks, n_q_heads, (), CALL)
    if alibi_slopes is not None and tuple(alibi_slopes.shape) != (n_q_heads,):
        raise ValueError(
            f"alibi_slopes.shape={tuple(alibi_slopes.shape)}, but should be (Hq,) = "
            f"({n_q_heads},) [ALIBI-1, {CALL}]"
        )
    if v_cache is not None:
        if v_cache.ndim != 4 or tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]):
            raise ValueError(
                f"v_cache.shape={tuple(v_cache.shape)}, but should be (num_pages, Hkv, "
                f"page_size, Ev) with num_pages, Hkv, page_size = {tuple(k_cache.shape[:3])} "
                f"[PAGED-1, {CALL}]"
            )
        return None
    if value_dim is None:
        raise ValueError(
            f"v_cache=None, but then value_dim should say how many leading channels of "
            f"the key cache are the values [MLA-1, {CALL}]"
        )
    return check_value_dim(value_dim, k_cache.shape[-1], CALL)


@dataclass(frozen=True)
class _Scores:
    """What every sequence's scores share: the rules, scale, softcap and ALiBi slopes
    ``(Hq, 1, 1)`` in the working dtype (or None)."""

    rules: Rules
    scale: float | None
    softcap: float | None
    slopes: Any


def _attend_rows(
    xp: ModuleType,
    cache: _Cache,
    scores: _Scores,
    q_rows: Any,
    b: int,
    start: int,
    first_position: int,
    n_keys: int,
    key_block: int,
    work: Any,
    mask_rows: Any = None,
) -> tuple[Any, Any]:
    """The state ``(out (Hq, n, Ev), lse (Hq, n))`` of query rows ``q_rows (Hq, n, E)`` at
    positions ``first_position …`` over sequence b's keys: only the keys some row may
    attend, in blocks of ``key_block`` merged by their log-sum-exps (MERGE-1); ``mask_rows
    (n, L_k)`` is these rows' part of the sequence's mask (PAGED-8), or None."""
    device = array_api_compat.device(q_rows)
    n_rows = q_rows.shape[1]
    t = xp.arange(first_position, first_position + n_rows, device=device)[:, None]
    lo, hi = scores.rules.key_range(first_position, first_position + n_rows - 1, n_keys)
    state = None
    for block_lo in range(lo, hi, key_block) if hi > lo else [lo]:
        block_hi = min(hi, block_lo + key_block)
        keys, values = cache.read(b, start + block_lo, start + block_hi, work)
        j = xp.arange(block_lo, block_hi, device=device)[None, :]
        # ALiBi from positions (ALIBI-2 anchored at t_i), a bias added after the softcap
        bias = None if scores.slopes is None else -scores.slopes * xp.astype(xp.abs(t - j), work)
        allowed = scores.rules.allowed(xp, t, j)
        if mask_rows is not None:
            allowed = xp.logical_and(allowed, mask_rows[:, block_lo:block_hi])
        part = scaled_dot_product_attention(
            q_rows,
            keys,
            values,
            mask=allowed,
            bias=bias,
            scale=scores.scale,
            softcap=scores.softcap,
            return_lse=True,
        )
        state = part if state is None else merge_attention_states(*state, *part)
    assert state is not None  # the block loop runs at least once
    out, lse = state
    return out, lse


def paged_attention(
    q: Array,
    k_cache: Array,
    v_cache: Array,
    cu_seqlens_q: Array,
    seqused_k: Array,
    block_table: Array,
    *,
    value_dim: int | None = None,
    cache_leftpad: Array = None,
    is_causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    alibi_slopes: Array = None,
    window: tuple[int | None, int | None] = (None, None),
    attention_chunk: int | None = None,
    n_sink_tokens: int = 0,
    sinks: Array = None,
    mask: Array = None,
    return_lse: bool = False,
) -> Any:
    """Attention of a packed batch of sequences over a paged cache (PAGED-2).

    Sequence b's queries ``q[cu_q[b]:cu_q[b+1]]`` attend its keys at logical positions
    ``cache_leftpad[b] … seqused_k[b] - 1`` (position t: slot ``t % P`` of page
    ``block_table[b, t // P]``), bottom-right aligned: causal rule, ``window`` (left, right)
    (SPARSE-2.1), ``attention_chunk`` (CHUNK-1) and ALiBi ``alibi_slopes (Hq,)`` are
    measured from query position ``t_i = i + L_k - L_q``; the first ``n_sink_tokens`` keys
    of each sequence stay visible beside the window (SINK-4); ``sinks (Hq,)`` are SINK-1's;
    ``mask`` is flattened, ``(sum_b L_q,b * L_k,b,)`` boolean (PAGED-8).
    ``v_cache=None`` with ``value_dim=r`` reads the values as the first r channels of the
    key cache (absorbed MLA, MLA-1).  Returns ``out (T_q, Hq, Ev)`` in q's dtype (rows past
    ``cu_seqlens_q[-1]`` are 0), or ``(out, lse)`` with ``lse (Hq, T_q)`` in the
    accumulation dtype (-inf for those rows).
    """
    xp = namespace_of(
        CALL,
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        mask=mask,
    )
    check_flag("return_lse", return_lse, CALL)
    check_flag("is_causal", is_causal, CALL)
    chunk = (
        None
        if attention_chunk is None
        else check_size("attention_chunk", attention_chunk, CALL, minimum=1)
    )
    n_sink_tokens = check_size("n_sink_tokens", n_sink_tokens, CALL)
    rules = Rules(is_causal, *check_window(window), chunk, n_sink_tokens)
    value_dim = _check_arrays(xp, q, k_cache, v_cache, value_dim, alibi_slopes, sinks)
    n_tokens, n_q_heads, _ = q.shape
    seqs = _check_sequences(
        cu_seqlens_q,
        seqused_k,
        block_table,
        cache_leftpad,
        n_tokens,
        k_cache.shape[0],
        k_cache.shape[2],
    )
    work = compute_dtype(xp, q.dtype)
    scores = _Scores(
        rules,
        check_scale(scale, CALL),
        softcap,
        None if alibi_slopes is None else xp.astype(alibi_slopes, work)[:, None, None],
    )
    cache = _Cache(xp, k_cache, v_cache, value_dim, seqs.table)
    lengths = [
        (seqs.offsets[b + 1] - seqs.offsets[b], seqs.ends[b] - seqs.starts[b])
        for b in range(len(seqs.offsets) - 1)
    ]
    masks: list[Any] = (
        [None] * len(lengths)
        if mask is None
        else sequence_masks(xp, mask, lengths, CALL, "PAGED-8")
    )
    outs, lses = [], []
    for b in range(len(seqs.offsets) - 1):
        n_queries, n_keys = lengths[b]
        rows = xp.astype(q[seqs.offsets[b] : seqs.offsets[b + 1], ...], work)
        # bounded memory: (Hq x rows x keys) blocks of about BLOCK_ELEMENTS
        key_block = max(1, BLOCK_ELEMENTS // (n_q_heads * 16))
        row_chunk = max(1, BLOCK_ELEMENTS // (n_q_heads * max(1, min(n_keys, key_block))))
        for first in range(0, n_queries, row_chunk):
            q_rows = xp.permute_dims(
                rows[first : min(first + row_chunk, n_queries), ...], (1, 0, 2)
            )
            out, lse = _attend_rows(
                xp,
                cache,
                scores,
                q_rows,
                b,
                seqs.starts[b],
                first + n_keys - n_queries,
                n_keys,
                key_block,
                work,
                None if masks[b] is None else masks[b][first : first + q_rows.shape[1], :],
            )
            if sinks is not None:
                out, lse = with_sinks(out, lse, sinks)
            outs.append(xp.permute_dims(out, (1, 0, 2)))
            lses.append(lse)
    padding = n_tokens - seqs.offsets[-1]
    width = value_dim if v_cache is None else v_cache.shape[-1]
    device = array_api_compat.device(q)
    outs.append(xp.zeros((padding, n_q_heads, width), dtype=work, device=device))
    lses.append(xp.full((n_q_heads, padding), -xp.inf, dtype=work, device=device))
    out = xp.astype(xp.concat(outs, axis=0), q.dtype)
    return (out, xp.concat(lses, axis=-1)) if return_lse else out
