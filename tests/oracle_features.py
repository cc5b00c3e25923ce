"""An independent float64 oracle for spec/features.md, written from its text in plain NumPy.

Like ``oracle.py`` it shares no code with ``attnspec.reference``: one query row at a time,
the scores of the Summary formula built term by term (scale, cap, bias, ALiBi), the
allowed set as a Python list, the log-sum-exp from its definition.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from oracle import causal_allows


def press_slopes(n_heads: int) -> list[float]:
    """ALIBI-3, the recursive ``get_slopes`` of Press et al. as published."""
    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(closest) + press_slopes(2 * closest)[0::2][: n_heads - closest]


def sdpa_features(
    q: Any, k: Any, v: Any, *, mask: Any = None, bias: Any = None, is_causal: bool = False,
    causal_alignment: str = "top_left", scale: float | None = None,
    softcap: float | None = None, alibi_slopes: Any = None, dropout_p: float = 0.0,
    dropout_keep: Any = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out, weights, lse) of features.md's Summary, row by row in float64.

    s_ij = c tanh(alpha q_i.k_j / c) + b_ij - m_h |i + delta - j|; the weights after
    dropout are p_ij keep_ij / (1 - p) (DROP-2); lse is of the scores, -inf for empty rows.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    *_, n_q_heads, n_queries, head_dim = q.shape
    n_kv_heads, n_keys, value_dim = k.shape[-3], k.shape[-2], v.shape[-1]
    batch = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    q = np.broadcast_to(q, (*batch, *q.shape[-3:]))
    k = np.broadcast_to(k, (*batch, *k.shape[-3:]))
    v = np.broadcast_to(v, (*batch, *v.shape[-3:]))
    scores_shape = (*batch, n_q_heads, n_queries, n_keys)

    def full(a: Any, dtype: Any) -> np.ndarray | None:
        return None if a is None else np.broadcast_to(np.asarray(a, dtype=dtype), scores_shape)

    mask, bias, keep = full(mask, bool), full(bias, np.float64), full(dropout_keep, bool)
    slopes = None if alibi_slopes is None else np.broadcast_to(
        np.asarray(alibi_slopes, np.float64), (*batch, n_q_heads))
    alpha = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    delta = 0 if causal_alignment == "top_left" else n_keys - n_queries
    group = n_q_heads // n_kv_heads

    out = np.zeros((*batch, n_q_heads, n_queries, value_dim))
    weights = np.zeros(scores_shape)
    lse = np.full((*batch, n_q_heads, n_queries), -math.inf)
    for b in np.ndindex(*batch):
        for h in range(n_q_heads):
            g = h // group
            for i in range(n_queries):
                allowed, scores = [], []
                for j in range(n_keys):
                    if mask is not None and not mask[(*b, h, i, j)]:
                        continue
                    if is_causal and not causal_allows(i, j, n_queries, n_keys, causal_alignment):
                        continue
                    x = alpha * sum(float(q[(*b, h, i, e)]) * float(k[(*b, g, j, e)])
                                    for e in range(head_dim))
                    s = softcap * math.tanh(x / softcap) if softcap is not None else x
                    if bias is not None:
                        s += float(bias[(*b, h, i, j)])
                    if slopes is not None:
                        s -= float(slopes[(*b, h)]) * abs(i + delta - j)
                    if s == -math.inf:
                        continue
                    allowed.append(j)
                    scores.append(s)
                if not allowed:
                    continue
                top = max(scores)
                exps = [math.exp(s - top) for s in scores]
                total = sum(exps)
                lse[(*b, h, i)] = top + math.log(total)
                for j, e in zip(allowed, exps, strict=True):
                    p = e / total
                    if keep is not None:
                        p = p / (1.0 - dropout_p) if keep[(*b, h, i, j)] else 0.0
                    weights[(*b, h, i, j)] = p
                    out[(*b, h, i)] += p * v[(*b, g, j)]
    return out, weights, lse
