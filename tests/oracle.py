"""An independent float64 oracle, written from the text of spec/dense.md in plain NumPy.

It shares no code with ``attnspec.reference``: every clause is evaluated the slow and
obvious way (one query row at a time, the allowed set S(i) built as a Python list), so
that a bug in the vectorised reference cannot hide behind the same bug here.  Inputs are
NumPy arrays (anything ``np.asarray`` takes); results are float64 NumPy arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


def causal_allows(i: int, j: int, n_queries: int, n_keys: int, alignment: str) -> bool:
    """SDPA-4.1 (top-left: j <= i) and SDPA-4.2 (bottom-right: j <= i + Lk - Lq)."""
    if alignment == "top_left":
        return j <= i
    if alignment == "bottom_right":
        return j <= i + n_keys - n_queries
    raise ValueError(f"unknown alignment {alignment!r}")


def causal_matrix(n_queries: int, n_keys: int, alignment: str) -> np.ndarray:
    """The (Lq, Lk) table of ``causal_allows``, entry by entry."""
    table = np.zeros((n_queries, n_keys), dtype=bool)
    for i in range(n_queries):
        for j in range(n_keys):
            table[i, j] = causal_allows(i, j, n_queries, n_keys, alignment)
    return table


@dataclass(frozen=True)
class Keywords:
    """An attention call's keywords with the spec's defaults: SDPA-1's mask, bias,
    is_causal and scale, SDPA-4.2's causal alignment, SOFTCAP-1's softcap, ALIBI-1's
    slopes and DROP-2's rate and keep pattern.  The oracle writes them out itself, so that
    it depends on nothing of the reference it checks; making one of an unknown keyword is a
    TypeError that names it."""

    mask: Any = None
    bias: Any = None
    is_causal: bool = False
    causal_alignment: str = "top_left"
    scale: float | None = None
    softcap: float | None = None
    alibi_slopes: Any = None
    dropout_p: float = 0.0
    dropout_keep: Any = None


def sdpa_rows(q: Any, k: Any, v: Any, **keywords: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out, weights, lse) of SDPA-7.1 and features.md's Summary, row by row in float64.

    S(i) holds the keys j the mask allows (SDPA-3.1), the causal rule allows (SDPA-4,
    combined by AND: SDPA-3.4) and whose score is not -inf (SDPA-3.3).  Query head h
    reads key/value head h // G (SDPA-6.1).  An empty S(i) gives a zero row (SDPA-5).
    s_ij = c tanh(alpha q_i.k_j / c) + b_ij - m_h |i + delta - j|; the weights after
    dropout are p_ij keep_ij / (1 - p) (DROP-2); lse is of the scores, -inf for empty rows.
    """
    call = Keywords(**keywords)
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

    mask, bias = full(call.mask, bool), full(call.bias, np.float64)
    keep = full(call.dropout_keep, bool)
    slopes = (
        None
        if call.alibi_slopes is None
        else np.broadcast_to(np.asarray(call.alibi_slopes, np.float64), (*batch, n_q_heads))
    )
    alpha = 1.0 / math.sqrt(head_dim) if call.scale is None else float(call.scale)
    is_causal, causal_alignment, softcap = call.is_causal, call.causal_alignment, call.softcap
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
                    x = alpha * sum(
                        float(q[(*b, h, i, e)]) * float(k[(*b, g, j, e)]) for e in range(head_dim)
                    )
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
                        p = p / (1.0 - call.dropout_p) if keep[(*b, h, i, j)] else 0.0
                    weights[(*b, h, i, j)] = p
                    out[(*b, h, i)] += p * v[(*b, g, j)]
    return out, weights, lse


def sdpa(q: Any, k: Any, v: Any, **options: Any) -> tuple[np.ndarray, np.ndarray]:
    """SDPA-7.1's ``(out, weights)`` (:func:`sdpa_rows`; options: mask, bias, is_causal,
    causal_alignment, scale)."""
    out, weights, _ = sdpa_rows(q, k, v, **options)
    return out, weights


def sinusoidal(n: int, d: int, base: float = 10000.0) -> np.ndarray:
    """POS-1: PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(the same)."""
    table = np.zeros((n, d))
    for p in range(n):
        for column in range(d):
            pair = column // 2
            angle = p / base ** (2 * pair / d)
            table[p, column] = math.sin(angle) if column % 2 == 0 else math.cos(angle)
    return table


def rope(
    x: Any, positions: Any = None, *, base: float = 10000.0, layout: str = "interleaved"
) -> np.ndarray:
    """ROPE-1: rotate each feature pair of ``x (..., L, d)`` by p * base^(-2i/d)."""
    x = np.asarray(x, dtype=np.float64)
    length, d = x.shape[-2], x.shape[-1]
    if positions is None:
        positions = np.arange(length)
    positions = np.broadcast_to(np.asarray(positions), x.shape[:-1])
    half = d // 2
    out = np.empty_like(x)
    for index in np.ndindex(*x.shape[:-1]):
        p = float(positions[index])
        for i in range(half):
            first, second = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + half)
            angle = p * base ** (-2 * i / d)
            a, b = x[(*index, first)], x[(*index, second)]
            out[(*index, first)] = a * math.cos(angle) - b * math.sin(angle)
            out[(*index, second)] = a * math.sin(angle) + b * math.cos(angle)
    return out


def mha(
    x: Any, y: Any = None, *, num_heads: int, num_kv_heads: int | None = None, **arguments: Any
) -> tuple[np.ndarray, np.ndarray]:
    """MHA-1/MHA-2: projections, head h = columns h*E:(h+1)*E, SDPA per head, concat, W_O.

    ``arguments`` are the projections' weights ``w_q, w_k, w_v, w_o`` (required) and biases
    ``b_q, b_k, b_v, b_o`` (optional); the rest go to :func:`sdpa` (mask, bias, is_causal,
    causal_alignment, scale).  Returns ``(out, weights)``.
    """
    missing = [f"w_{role}" for role in "qkvo" if f"w_{role}" not in arguments]
    if missing:
        raise TypeError(f"mha() needs the projection weights {missing}")
    w_q, w_k, w_v, w_o = (arguments.pop(f"w_{role}") for role in "qkvo")
    b_q, b_k, b_v, b_o = (arguments.pop(f"b_{role}", None) for role in "qkvo")
    x = np.asarray(x, dtype=np.float64)
    y = x if y is None else np.asarray(y, dtype=np.float64)
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads

    def project(inputs: np.ndarray, w: Any, b: Any) -> np.ndarray:
        out = np.einsum("...ld,de->...le", inputs, np.asarray(w, dtype=np.float64))
        return out if b is None else out + np.asarray(b, dtype=np.float64)

    def heads(projected: np.ndarray, count: int) -> np.ndarray:
        width = projected.shape[-1] // count
        return np.stack([projected[..., h * width : (h + 1) * width] for h in range(count)], -3)

    q = heads(project(x, w_q, b_q), num_heads)
    k = heads(project(y, w_k, b_k), num_kv_heads)
    v = heads(project(y, w_v, b_v), num_kv_heads)
    per_head, weights = sdpa(q, k, v, **arguments)
    concatenated = np.concatenate([per_head[..., h, :, :] for h in range(num_heads)], axis=-1)
    return project(concatenated, w_o, b_o), weights
