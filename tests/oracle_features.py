"""An independent float64 oracle for spec/features.md, written from its text in plain NumPy.

Like ``oracle.py`` it shares no code with ``attnspec.reference``: one query row at a time,
the scores of the Summary formula built term by term (scale, cap, bias, ALiBi), the
allowed set as a Python list, the log-sum-exp from its definition.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from oracle import causal_allows, sdpa_rows


def press_slopes(n_heads: int) -> list[float]:
    """ALIBI-3, the recursive ``get_slopes`` of Press et al. as published."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(closest) + press_slopes(2 * closest)[0::2][: n_heads - closest]


# features.md's Summary is evaluated by the one row-by-row oracle (oracle.sdpa_rows)
sdpa_features = sdpa_rows


def varlen(
    q: Any,
    k: Any,
    v: Any,
    cu_q: list[int],
    cu_k: list[int],
    *,
    alibi_slopes: Any = None,
    flat_mask: Any = None,
    **options: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """VARLEN-2 as a block-diagonal dense problem: one batch element of all T_q queries
    and T_k keys, a mask that lets token i of sequence b see key j of the same sequence
    only, and the causal rule, ALiBi and the flattened mask of VARLEN-6 (entry
    sum_{b' < b} Lq_b' Lk_b' + i Lk_b + j) with each sequence's own (Lq, Lk) built into the
    mask and the bias; tokens past the offsets belong to no sequence (VARLEN-5).  Returns
    (out (T_q, Hq, Ev), lse (Hq, T_q))."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    n_q_heads, total_q, total_k = q.shape[1], q.shape[0], k.shape[0]
    alignment = options.pop("causal_alignment", "top_left")
    is_causal = options.pop("is_causal", False)
    mask = np.zeros((total_q, total_k), dtype=bool)
    bias = np.zeros((n_q_heads, total_q, total_k))
    entry = 0
    for b in range(len(cu_q) - 1):
        n_queries, n_keys = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        delta = 0 if alignment == "top_left" else n_keys - n_queries
        slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, np.float64)
        if slopes is not None and slopes.ndim == 2:
            slopes = slopes[b]
        for i in range(n_queries):
            for j in range(n_keys):
                row, col = cu_q[b] + i, cu_k[b] + j
                mask[row, col] = not is_causal or causal_allows(i, j, n_queries, n_keys, alignment)
                if flat_mask is not None:
                    mask[row, col] &= bool(flat_mask[entry])
                    entry += 1
                if slopes is not None:
                    bias[:, row, col] = -slopes * abs(i + delta - j)
    out, _, lse = sdpa_features(
        q.transpose(1, 0, 2),
        k.transpose(1, 0, 2),
        v.transpose(1, 0, 2),
        mask=mask,
        bias=bias,
        **options,
    )
    return out.transpose(1, 0, 2), lse


def kv_cache(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    lengths: list[int],
    *,
    k: Any = None,
    v: Any = None,
    block_table: Any = None,
    **options: Any,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """KVCACHE-2 and KVCACHE-4: write the new keys into a copy of the cache, position by
    position (through the block table when paged), then attend each batch element's first
    cache_seqlens[b] + L_new logical positions, bottom-right.  Returns (out, lse, k_cache
    after, v_cache after)."""
    q = np.asarray(q, np.float64)
    k_after, v_after = (np.array(c, dtype=np.float64) for c in (k_cache, v_cache))
    n_new = 0 if k is None else np.shape(k)[2]
    block_size = k_after.shape[2]

    def where(b: int, t: int) -> tuple[int, int]:  # (cache index, position) of logical t
        if block_table is None:
            return b, t
        return int(block_table[b][t // block_size]), t % block_size

    for b, length in enumerate(lengths):
        for t in range(n_new):
            index, position = where(b, length + t)
            k_after[index, :, position] = k[b][:, t]
            v_after[index, :, position] = v[b][:, t]
    outs, lses = [], []
    for b, length in enumerate(lengths):
        total = length + n_new
        keys, values = (
            np.stack([c[where(b, t)[0], :, where(b, t)[1]] for t in range(total)], 1)
            if total
            else np.zeros((c.shape[1], 0, c.shape[3]))
            for c in (k_after, v_after)
        )
        slopes = options.get("alibi_slopes")
        per_batch = dict(options)
        if slopes is not None and np.ndim(slopes) == 2:
            per_batch["alibi_slopes"] = np.asarray(slopes)[b]
        out, _, lse = sdpa_features(
            q[b], keys, values, causal_alignment="bottom_right", **per_batch
        )
        outs.append(out)
        lses.append(lse)
    return np.stack(outs), np.stack(lses), k_after, v_after
