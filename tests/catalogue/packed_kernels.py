"""Packed (varlen) and KV-cache kernels for the catalogue, correct and buggy, in NumPy.

Correct ones: a block-diagonal mask over the packed tokens (xformers' ``BlockDiagonalMask``
and FlexAttention's document masks), a loop over sequences (FlashAttention's varlen
kernel works per sequence), and a KV-cache kernel that writes the new keys in place and
reads its cache through the block table.  Each bug changes one of these in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from attnspec.conformance import declare

from .blocks import named
from .entry import REQUIRED, SpecCall, namespace, required, signed, spec_function
from .feature_blocks import Features, arranged, attend_features
from .paged_batch import Options, visible

Array = np.ndarray
VARLEN = {
    "varlen": True,
    "varlen_mask": True,
    "gqa": True,
    "causal_alignment": "bottom_right",
    "softcap": True,
    "alibi": True,
    "lse_keyword": "return_lse",
    "returns_lse": True,
    "sinks": True,
}
# the keywords of the libraries' signatures the kernels mimic: FlashAttention's
# flash_attn_varlen_func and flash_attn_with_kvcache (positional q, k_cache, v_cache)
FEATURES = {
    "scale": None,
    "softcap": None,
    "alibi_slopes": None,
    "return_lse": False,
    "sinks": None,
}
VARLEN_KEYWORDS = {
    **required("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"),
    "is_causal": False,
    **FEATURES,
    "custom_mask": None,
}
CACHE_KEYWORDS = {
    "cache_seqlens": REQUIRED,
    **dict.fromkeys(("k", "v", "block_table"), None),
    "is_causal": False,
    **FEATURES,
    "cache_leftpad": None,
    "window_size": (-1, -1),
    "attention_chunk": 0,
    "n_sink_tokens": 0,
}
CACHE = {
    "kv_cache": True,
    "kv_cache_features": ("leftpad", "window", "chunk", "sink_tokens"),
    "kv_cache_paged": True,
    "gqa": True,
    "softcap": True,
    "alibi": True,
    "lse_keyword": "return_lse",
    "returns_lse": True,
    "sinks": True,
}


def _offsets(cu: Array, total: int) -> list[int]:
    """Offsets from 0 to at most ``total``: tokens past the last one are padding
    (VARLEN-5)."""
    offsets = [int(x) for x in np.asarray(cu)]
    if offsets[0] != 0 or offsets[-1] > total or np.any(np.diff(offsets) < 0):
        raise ValueError(f"cu_seqlens={offsets}: should rise from 0 to at most {total} [VARLEN-1]")
    return offsets


def _block_diagonal(call: SpecCall, bug: str = "") -> Any:
    """One dense call over all tokens: a mask lets sequence b's queries see its own keys
    (causally, bottom-right within the sequence, and where its part of the flattened
    ``custom_mask`` allows), and the ALiBi bias is built per sequence from the same offset;
    padding tokens past the offsets belong to no sequence.  ``bug`` names the one step done
    wrong ("": none): the packed totals' offset T_k - T_q for every sequence
    (global_alignment), keys starting a token before the sequence (sees_previous_key), query
    offsets clipped to the tokens instead of checked (unchecked_offsets), NaN rows for a
    sequence without keys (empty_keys_nan), padding rows left as uninitialised memory, NaN
    (padding_rows_nan), the last sequence's keys running to the end of k (keys_to_the_end),
    the mask of sequence b read at cu_q[b] * Lk_b (mask_at_query_offset), and the sink
    logits taken but never applied (sinks_ignored)."""
    q, k, v, _, _, is_causal, scale = call
    cu_seqlens_q, cu_seqlens_k, custom_mask = call.cu_seqlens_q, call.cu_seqlens_k, call.custom_mask
    alibi_slopes = call.alibi_slopes
    heads, total_q, total_k = q.shape[1], q.shape[0], k.shape[0]
    if bug == "unchecked_offsets":
        cu_q = [int(x) for x in np.minimum(np.maximum.accumulate(cu_seqlens_q), total_q)]
        cu_q[-1] = total_q
    else:
        cu_q = _offsets(cu_seqlens_q, total_q)
    cu_k = _offsets(cu_seqlens_k, total_k)
    if bug == "keys_to_the_end":
        cu_k[-1] = total_k
    mask = np.zeros((total_q, total_k), dtype=bool)
    bias = np.zeros((heads, total_q, total_k))
    entry = 0  # sequence b's first element of custom_mask
    early_keys = 1 if bug == "sees_previous_key" else 0
    for b in range(len(cu_q) - 1):
        first_key = max(cu_k[b] - early_keys, 0)
        rows, cols = slice(cu_q[b], cu_q[b + 1]), slice(first_key, cu_k[b + 1])
        n_q, n_k = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - first_key
        offset = total_k - total_q if bug == "global_alignment" else n_k - n_q
        allowed = np.ones((n_q, n_k), dtype=bool)
        if is_causal:
            allowed = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset
        if custom_mask is not None:
            flat = np.asarray(custom_mask)
            misread = bug == "mask_at_query_offset"
            at = min(cu_q[b] * n_k, flat.size - n_q * n_k) if misread else entry
            allowed = allowed & flat[at : at + n_q * n_k].reshape(n_q, n_k)
            entry += n_q * n_k
        mask[rows, cols] = allowed
        if alibi_slopes is not None:
            slopes = np.asarray(alibi_slopes, np.float64)
            slopes = slopes[b] if slopes.ndim == 2 else slopes
            gaps = np.abs(np.arange(n_q)[:, None] + offset - np.arange(n_k)[None, :])
            bias[:, rows, cols] = -slopes[:, None, None] * gaps
    # the sink logits join every sequence's rows (SINK-6), unless the bug drops them
    f = Features(softcap=call.softcap, sinks=None if bug == "sinks_ignored" else call.sinks)
    swap = (1, 0, 2)
    # the ALiBi bias stays in float64 until arrange casts it to the computation dtype:
    # rounding it to a half-precision input dtype would be an error TOL-4 does not allow
    a = arranged(
        *(x.transpose(swap) for x in (q, k, v)),
        mask,
        bias if alibi_slopes is not None else None,
        False,
        scale,
        f,
    )
    out, lse = attend_features(a, f, returns_lse=True)
    out = out.transpose(swap)
    lse[:, cu_q[-1] :] = -np.inf  # padding rows are no query: no sink joins them (SINK-6)
    if bug == "empty_keys_nan":
        for b in range(len(cu_q) - 1):
            if cu_k[b + 1] == cu_k[b]:
                out[cu_q[b] : cu_q[b + 1]] = np.nan
    if bug == "padding_rows_nan":  # torch.empty's output rows past cu_seqlens_q[-1], never written
        out[cu_q[-1] :] = np.nan
    return (out, lse) if call.return_lse else out


def _varlen_kernel(name: str, doc: str, bug: str = "") -> Callable[..., Any]:
    """A varlen kernel (FlashAttention's flash_attn_varlen_func signature) computing
    :func:`_block_diagonal` with ``bug``."""

    @declare(**VARLEN)
    @spec_function(VARLEN_KEYWORDS)
    def kernel(call: SpecCall) -> Any:
        return _block_diagonal(call, bug)

    return named(kernel, name, doc)


varlen_block_diagonal = _varlen_kernel(
    "varlen_block_diagonal",
    "(v1) A block-diagonal mask over the packed tokens, bottom-right per sequence.",
)
varlen_global_alignment = _varlen_kernel(
    "varlen_global_alignment",
    "Aligns every sequence's causal rule and ALiBi with the packed totals, T_k - T_q, "
    "instead of its own L_k - L_q.",
    bug="global_alignment",
)
varlen_sees_previous_key = _varlen_kernel(
    "varlen_sees_previous_key",
    "Starts each sequence's keys one token early (cu_k[b] - 1): it sees the previous "
    "sequence's last key.",
    bug="sees_previous_key",
)
varlen_empty_keys_nan = _varlen_kernel(
    "varlen_empty_keys_nan",
    "Divides by a zero row sum for a sequence without keys: its rows are NaN.",
    bug="empty_keys_nan",
)
varlen_padding_rows_nan = _varlen_kernel(
    "varlen_padding_rows_nan",
    "Leaves the output rows past cu_seqlens_q[-1] as the uninitialised memory of its output "
    "(NaN here), as torch.empty outputs do (flash-attention #1228, PR 2324).",
    bug="padding_rows_nan",
)
varlen_keys_to_the_end = _varlen_kernel(
    "varlen_keys_to_the_end",
    "Gives the last sequence every key up to the end of k instead of cu_seqlens_k[-1]: the "
    "padding keys are attended (sgl-project/sglang #15757).",
    bug="keys_to_the_end",
)
varlen_mask_at_query_offset = _varlen_kernel(
    "varlen_mask_at_query_offset",
    "Reads sequence b's part of the flattened custom_mask at cu_seqlens_q[b] * Lk_b instead of "
    "after the earlier sequences' Lq * Lk entries: right only where the key lengths are equal.",
    bug="mask_at_query_offset",
)
varlen_sinks_ignored = _varlen_kernel(
    "varlen_sinks_ignored",
    "Takes sink logits and never applies them in its packed path, as a prefill path that "
    "accepted sinks= and dropped them did (vllm-project/vllm #52148; SINK-6).",
    bug="sinks_ignored",
)
varlen_unchecked_offsets = _varlen_kernel(
    "varlen_unchecked_offsets",
    "Trusts its offsets: clips them to the tokens it has instead of rejecting them "
    "(xformers #1122).",
    bug="unchecked_offsets",
)


# --- KV caches ----------------------------------------------------------------------------


def _position(block_table: Array | None, block: int, b: int, t: int) -> tuple[int, int]:
    if block_table is None:
        return b, t
    return int(block_table[b][t // block]), t % block


def _cache_attention(call: SimpleNamespace, bug: str = "") -> Any:
    """Write the new keys in place at cache_seqlens[b], then attend each batch element's
    logical positions cache_leftpad[b] … cache_seqlens[b] - 1 and its L_new new keys, the
    causal rule, ALiBi, window and chunk measured bottom-right.  ``bug`` names the one step
    done wrong ("": none): one stale position read too many (reads_one_more), the new keys
    written one position late and read there (writes_one_late), the causal rule and ALiBi
    top-left (top_left), the blocks in memory order (ignores_table), the softmax shifted by
    the whole cache rows' maximum (stale_max), the left padding read (ignores_leftpad), the
    window and chunk measured from the cache's first position, t_i = i (window_top_left),
    zero weights times the stale values (values_over_capacity), the sink's term added to
    the numerator too (sink_in_numerator), the window applied to the sink tokens too
    (sink_tokens_windowed)."""
    write_at = 1 if bug == "writes_one_late" else 0
    read_extra = 1 if bug in ("reads_one_more", "writes_one_late") else 0
    alignment = "top_left" if bug == "top_left" else "bottom_right"
    q, k_cache, v_cache, k, v = call.q, call.k_cache, call.v_cache, call.k, call.v
    block_table, alibi_slopes = call.block_table, call.alibi_slopes
    block = k_cache.shape[2]
    n_new = 0 if k is None else k.shape[2]
    table = None if block_table is None else np.asarray(block_table)
    if table is not None and bug == "ignores_table":
        table = np.arange(table.size).reshape(table.shape)
    lengths = [int(x) for x in np.asarray(call.cache_seqlens)]
    for b, length in enumerate(lengths):
        for t in range(n_new):
            index, position = _position(table, block, b, length + write_at + t)
            k_cache[index, :, position] = k[b, :, t]
            v_cache[index, :, position] = v[b, :, t]
    sink_tokens = 0 if bug == "sink_tokens_windowed" else call.n_sink_tokens
    options = Options(
        call.cache_leftpad, call.window_size, call.attention_chunk, n_sink_tokens=sink_tokens
    )
    pads = options.cache_leftpad
    outs, lses = [], []
    for b, length in enumerate(lengths):
        first = 0 if pads is None or bug == "ignores_leftpad" else int(pads[b])
        total = length + read_extra + n_new
        places = [_position(table, block, b, t) for t in range(first, total)]
        keys = (
            np.stack([k_cache[i, :, p] for i, p in places], axis=1)
            if places
            else k_cache[:1, :, :0][0]
        )
        values = (
            np.stack([v_cache[i, :, p] for i, p in places], axis=1)
            if places
            else v_cache[:1, :, :0][0]
        )
        slopes = (
            None
            if alibi_slopes is None
            else (alibi_slopes[b] if np.ndim(alibi_slopes) == 2 else alibi_slopes)
        )
        f = Features(
            softcap=call.softcap, alibi_slopes=slopes, alignment=alignment, sinks=call.sinks
        )
        n_queries, n_keys = q.shape[2], len(places)
        offset = 0 if bug == "window_top_left" else n_keys - n_queries
        windowed = visible(n_queries, n_keys, offset, False, options._replace(cache_leftpad=None))
        a = arranged(q[b], keys, values, windowed, None, call.is_causal, call.scale, f)
        if bug == "stale_max":
            out, lse = _shifted_by_block_max(a, f, q[b], k_cache, table, block, b)
        else:
            out, lse = attend_features(a, f, returns_lse=True)
        if bug == "sink_in_numerator" and call.sinks is not None:
            # the sink's weight e^(sink - lse) added to every channel, a value of 1
            sink = np.asarray(call.sinks, np.float64)[:, None, None]
            out = (out.astype(np.float64) + np.exp(sink - lse[..., None])).astype(out.dtype)
        if bug == "values_over_capacity":
            out = _plus_zero_weights_over_capacity(out, v_cache, table, b)
        outs.append(out)
        lses.append(lse)
    out, lse = np.stack(outs), np.stack(lses)
    return (out, lse) if call.return_lse else out


def _shifted_by_block_max(
    a: Any, f: Features, q: Array, k_cache: Array, table: Array | None, block: int, b: int
) -> tuple[Array, Array]:
    """The softmax shifted by the maximum over every position of the cache rows it
    touched, stale ones included: harmless in exact arithmetic, but a stale score far
    above the valid ones underflows every valid weight."""
    from .feature_blocks import feature_scores, log_sum_exp, weighted

    s, allowed = feature_scores(a, f)
    rows = [k_cache[b]] if table is None else [k_cache[i] for i in table[b]]
    every = np.concatenate(rows, axis=-2).astype(s.dtype)
    groups = q.shape[-3] // every.shape[-3]
    stale = np.matmul(q.astype(s.dtype), np.swapaxes(np.repeat(every, groups, axis=-3), -1, -2))
    m = np.maximum(
        np.max(s, axis=-1, keepdims=True, initial=-np.inf),
        np.max(stale * s.dtype.type(a.scale), axis=-1, keepdims=True, initial=-np.inf),
    )
    m = np.where(np.isfinite(m), m, 0)
    with np.errstate(all="ignore"):
        e = np.where(allowed, np.exp(s - m), 0).astype(s.dtype)
        total = e.sum(axis=-1, keepdims=True)
        out = weighted(e, allowed, a.v) / np.where(total == 0, 1, total)
    return out.astype(a.out_dtype), log_sum_exp(s, allowed)


def _plus_zero_weights_over_capacity(
    out: Array, v_cache: Array, table: Array | None, b: int
) -> Array:
    """``out`` plus a zero weight times every value of the cache rows it touched, stale
    ones included, as a P V tile over the whole capacity computes it: exact for finite
    values (0 * v = 0), NaN wherever a stale value is NaN."""
    rows = [v_cache[b]] if table is None else [v_cache[i] for i in table[b]]
    every = np.concatenate(rows, axis=-2).astype(np.float64)
    groups = out.shape[-3] // every.shape[-3]
    zero = np.zeros((*out.shape[:-1], every.shape[-2]))
    with np.errstate(invalid="ignore"):
        tile = np.matmul(zero, np.repeat(every, groups, axis=-3))
    return (out.astype(np.float64) + tile).astype(out.dtype)


def _cache_kernel(name: str, doc: str, *, paged: bool = True, bug: str = "") -> Callable[..., Any]:
    """A KV-cache kernel (contiguous or paged) with the bug ``bug`` of _cache_attention."""

    @declare(**{**CACHE, "kv_cache_paged": paged})
    @signed(CACHE_KEYWORDS, ("q", "k_cache", "v_cache"), namespace)
    def kernel(call: SimpleNamespace) -> Any:
        return _cache_attention(call, bug)

    return named(kernel, name, doc)


IN_PLACE = (
    "FlashAttention's flash_attn_with_kvcache: new keys written into the cache in place "
    "at cache_seqlens, then attention over the first cache_seqlens + L_new logical "
    "positions, bottom-right"
)
kv_cache_in_place = _cache_kernel("kv_cache_in_place", f"(k1) {IN_PLACE}, paged.")
kv_cache_contiguous = _cache_kernel(
    "kv_cache_contiguous", f"(k2) {IN_PLACE}, contiguous.", paged=False
)
kv_cache_reads_one_more = _cache_kernel(
    "kv_cache_reads_one_more",
    "Attends cache_seqlens[b] + 1 cached keys: one stale position too many.",
    bug="reads_one_more",
)
kv_cache_top_left = _cache_kernel(
    "kv_cache_top_left",
    "Aligns the causal rule and ALiBi top-left, as for a prompt, not bottom-right.",
    bug="top_left",
)
kv_cache_ignores_leftpad = _cache_kernel(
    "kv_cache_ignores_leftpad",
    "Ignores cache_leftpad: attends every cache position from 0, the left padding included.",
    bug="ignores_leftpad",
)
kv_cache_window_top_left = _cache_kernel(
    "kv_cache_window_top_left",
    "Measures the window and the chunk from the cache's first position (t_i = i) while the "
    "causal rule stays bottom-right: a decoding query sees keys far outside its window.",
    bug="window_top_left",
)
kv_cache_writes_one_late = _cache_kernel(
    "kv_cache_writes_one_late",
    "Writes the new keys at cache_seqlens[b] + 1, leaving a hole, and reads them there.",
    bug="writes_one_late",
)
kv_cache_stale_max = _cache_kernel(
    "kv_cache_stale_max",
    "Shifts the softmax by the maximum over the whole cache rows, stale positions included.",
    bug="stale_max",
)
kv_cache_values_over_capacity = _cache_kernel(
    "kv_cache_values_over_capacity",
    "Multiplies the zero weights of the positions past cache_seqlens by their values (a P V "
    "tile over the whole cache rows): exact for finite stale values, NaN from NaN ones.",
    bug="values_over_capacity",
)
kv_cache_sink_in_numerator = _cache_kernel(
    "kv_cache_sink_in_numerator",
    "Adds the sink's term e^(sink - m) to the numerator as well as the denominator, as if "
    "the sink had a value of 1 in every channel (SINK-1, SINK-6).",
    bug="sink_in_numerator",
)
kv_cache_sink_tokens_windowed = _cache_kernel(
    "kv_cache_sink_tokens_windowed",
    "Ignores n_sink_tokens: the window hides the sink tokens too, once it has moved past them, "
    "the case StreamingLLM keeps them for (SINK-4).",
    bug="sink_tokens_windowed",
)
kv_cache_ignores_table = _cache_kernel(
    "kv_cache_ignores_table",
    "Reads and writes the blocks in memory order (block b * M + j), ignoring block_table.",
    bug="ignores_table",
)
