"""An independent float64 oracle for spec/serving.md, written from its text in plain NumPy.

It shares no code with ``attnspec.reference``: one query row at a time, the allowed set of
each row from the clauses' formulas, the sink as one more term of the denominator (SINK-1),
the cache read position by position through the block table (PAGED-1), the merge from
MERGE-1's two lines, and float8 rounding by ml_dtypes' casts (where installed).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

Allowed = Callable[[int], np.ndarray]  # row i -> boolean array over the keys


@dataclass(frozen=True)
class Scoring:
    """What decides one row's scores and denominator besides q and k, with the spec's
    defaults: the scale (SDPA-2), SOFTCAP-1's softcap, ALIBI-2's slopes with the queries'
    positions, SINK-1's sink logits.  Written out here, so that the oracle depends on
    nothing of the reference it checks; making one of an unknown keyword is a TypeError
    that names it."""

    scale: float | None = None
    softcap: float | None = None
    slopes: Any = None
    positions: Any = None
    sinks: Any = None


def attend(
    q: Any, k: Any, v: Any, allowed: Allowed, **scoring: Any
) -> tuple[np.ndarray, np.ndarray]:
    """``q (Hq, Lq, E)``, ``k (Hkv, Lk, E)``, ``v (Hkv, Lk, Ev)`` -> (out, lse), row by row.

    ``allowed(i)`` is row i's S(i) over the keys; ALiBi subtracts ``slopes[h] |t_i - j|``
    with ``positions[i] = t_i``; ``sinks[h]`` joins the denominator with no value (SINK-1)
    and lse is then the log of the whole denominator (SINK-3); ``scoring``: :class:`Scoring`."""
    call = Scoring(**scoring)
    softcap, slopes, positions, sinks = call.softcap, call.slopes, call.positions, call.sinks
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    n_q_heads, n_queries, head_dim = q.shape
    n_kv_heads, n_keys, value_dim = k.shape[0], k.shape[1], v.shape[2]
    alpha = 1.0 / math.sqrt(head_dim) if call.scale is None else call.scale
    out = np.zeros((n_q_heads, n_queries, value_dim))
    lse = np.full((n_q_heads, n_queries), -math.inf)
    group = n_q_heads // n_kv_heads
    assert n_q_heads == group * n_kv_heads, "GQA: Hq is a multiple of Hkv"
    for i in range(n_queries):
        keys = np.flatnonzero(allowed(i)) if n_keys else np.zeros(0, int)
        if not len(keys) and sinks is None:
            continue  # no term in the denominator: out 0, lse -inf
        for g in range(n_kv_heads):
            # the row's keys and values, read once for the query heads of kv head g
            row_k, row_v = k[g, keys], v[g, keys]
            for h in range(g * group, (g + 1) * group):
                scores = alpha * (row_k @ q[h, i])
                if softcap is not None:
                    scores = softcap * np.tanh(scores / softcap)
                if slopes is not None:
                    scores = scores - float(slopes[h]) * np.abs(positions[i] - keys)
                # the largest term of the denominator, the sink's among them
                top = scores.max(initial=-math.inf)
                if sinks is not None:
                    top = max(top, float(sinks[h]))
                exps = np.exp(scores - top)
                sink = math.exp(float(sinks[h]) - top) if sinks is not None else 0
                denominator = exps.sum() + sink
                out[h, i] = exps @ row_v / denominator
                lse[h, i] = top + math.log(denominator)
    return out, lse


def causal(n_queries: int, n_keys: int, offset: int) -> Allowed:
    """SDPA-4: j <= i + offset."""
    return lambda i: np.arange(n_keys) <= i + offset


def streaming(n_queries: int, n_keys: int, n_sink: int, window: int, offset: int) -> Allowed:
    """SINK-4: j <= t and (j < n or t - window <= j), t = i + offset."""

    def row(i: int) -> np.ndarray:
        t, j = i + offset, np.arange(n_keys)
        return (j <= t) & ((j < n_sink) | (j >= t - window))

    return row


def chunked(n_queries: int, n_keys: int, chunk: int, offset: int) -> Allowed:
    """CHUNK-1: j <= t and floor(j / C) == floor(t / C)."""

    def row(i: int) -> np.ndarray:
        t = i + offset
        return np.array(
            [j <= t and math.floor(j / chunk) == math.floor(t / chunk) for j in range(n_keys)], bool
        )

    return row


def merge(o_a: Any, l_a: Any, o_b: Any, l_b: Any) -> tuple[np.ndarray, np.ndarray]:
    """MERGE-1 and MERGE-3, element by element in float64."""
    o_a, o_b = np.asarray(o_a, np.float64), np.asarray(o_b, np.float64)
    l_a, l_b = np.asarray(l_a, np.float64), np.asarray(l_b, np.float64)
    out, lse = np.zeros(o_a.shape), np.full(l_a.shape, -math.inf)
    for index in np.ndindex(*l_a.shape):
        a, b = float(l_a[index]), float(l_b[index])
        if a == -math.inf and b == -math.inf:
            continue
        top = max(a, b)
        total = math.exp(a - top) + math.exp(b - top)
        lse[index] = top + math.log(total)
        for part, level in ((o_a, a), (o_b, b)):
            if level != -math.inf:
                out[index] += math.exp(level - lse[index]) * part[index]
    return out, lse


def paged(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    cu_q: list[int],
    used: list[int],
    table: list[list[int]],
    *,
    leftpad: list[int] | None = None,
    value_dim: int | None = None,
    is_causal: bool = False,
    window: tuple[int | None, int | None] = (None, None),
    chunk: int | None = None,
    flat_mask: Any = None,
    sink_tokens: int = 0,
    **options: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """PAGED-2: each sequence's keys read position by position through its block table,
    its queries the last positions; rows past cu_q[-1] are left 0 (lse -inf); PAGED-8's
    flattened mask read entry by entry, sequence after sequence; the sequence's first
    ``sink_tokens`` keys kept beside the window (SINK-4)."""
    q = np.asarray(q, np.float64)
    k_cache = np.asarray(k_cache, np.float64)
    page = k_cache.shape[2]
    n_tokens, n_q_heads, _ = q.shape
    width = value_dim if v_cache is None else np.asarray(v_cache).shape[-1]
    out = np.zeros((n_tokens, n_q_heads, width))
    lse = np.full((n_q_heads, n_tokens), -math.inf)
    left, right = window
    entry = 0  # the flattened mask's first entry of sequence b
    for b in range(len(cu_q) - 1):
        start = 0 if leftpad is None else leftpad[b]
        positions = range(start, used[b])
        keys = (
            np.stack([k_cache[table[b][t // page], :, t % page] for t in positions], axis=1)
            if positions
            else np.zeros((k_cache.shape[1], 0, k_cache.shape[3]))
        )
        if v_cache is None:
            values = keys[..., :value_dim]
        else:
            values = (
                np.stack(
                    [
                        np.asarray(v_cache, np.float64)[table[b][t // page], :, t % page]
                        for t in positions
                    ],
                    axis=1,
                )
                if positions
                else np.zeros((k_cache.shape[1], 0, width))
            )
        n_queries, n_keys = cu_q[b + 1] - cu_q[b], len(positions)
        offset = n_keys - n_queries

        def row(i: int, n_keys: int = n_keys, offset: int = offset, first: int = entry) -> Any:
            t, j = i + offset, np.arange(n_keys)
            ok = np.ones(n_keys, bool)
            if flat_mask is not None:
                ok &= [bool(flat_mask[first + i * n_keys + c]) for c in range(n_keys)]
            if is_causal:
                ok &= j <= t
            if left is not None:
                ok &= (t - j <= left) | (j < sink_tokens)
            if right is not None and not is_causal:
                ok &= j - t <= right
            if chunk is not None:
                ok &= (j <= t) & (j // chunk == t // chunk)
            return ok

        rows = q[cu_q[b] : cu_q[b + 1]].transpose(1, 0, 2)
        o, l = attend(rows, keys, values, row, positions=np.arange(n_queries) + offset, **options)
        out[cu_q[b] : cu_q[b + 1]] = o.transpose(1, 0, 2)
        lse[:, cu_q[b] : cu_q[b + 1]] = l
        entry += n_queries * n_keys
    return out, lse
