"""NumPy building blocks for the catalogue kernels, written from spec/dense.md.

They share no code with ``attnspec.reference``: each step is the spec's definition in
plain NumPy.  The correct kernels in :mod:`catalogue.correct` compose them, and every
buggy kernel in :mod:`catalogue.buggy` composes them with exactly one step replaced, so
a bug is one visible line, not a rewrite.

Conventions: after :func:`arrange`, ``q`` is ``(*batch, Hq, Lq, E)``, ``k``/``v`` are
expanded to the query heads ``(*batch, Hq, Lk, ·)``, ``allowed`` and ``bias`` are
``(*batch, Hq, Lq, Lk)``, and everything is in the computation dtype (float32 for
float16 inputs, SDPA-7.2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

ALIGNMENTS = ("top_left", "bottom_right")
# Kernels compute exp(-inf), inf - inf and 0/0 on purpose and mask the results.
QUIET = {"all": "ignore"}


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """float16 is computed in float32 (SDPA-7.2); float32/float64 in their own dtype."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def default_scale(head_dim: int) -> float:
    """SDPA-2.1: 1/sqrt(E), E the query/key head dim."""
    return 1.0 / math.sqrt(head_dim)


def causal_table(n_queries: int, n_keys: int, alignment: str) -> np.ndarray:
    """(Lq, Lk) bool: top-left j <= i (SDPA-4.1), bottom-right j <= i + Lk - Lq (SDPA-4.2)."""
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment={alignment!r}, but should be one of {ALIGNMENTS}")
    offset = 0 if alignment == "top_left" else n_keys - n_queries
    return np.arange(n_keys)[None, :] <= np.arange(n_queries)[:, None] + offset


def contiguous_groups(n_q_heads: int, n_kv_heads: int) -> np.ndarray:
    """SDPA-6.1: query head h reads key/value head h // G, G = Hq / Hkv."""
    return np.arange(n_q_heads) // (n_q_heads // n_kv_heads)


def check_heads(n_q_heads: int, n_kv_heads: int) -> None:
    """SDPA-6.2: Hq must be a whole multiple of Hkv."""
    if n_kv_heads == 0 or n_q_heads % n_kv_heads:
        raise ValueError(
            f"q.shape[-3]={n_q_heads} query heads, but should be a multiple of "
            f"k.shape[-3]={n_kv_heads} key/value heads [SDPA-6.2]"
        )


@dataclass(frozen=True)
class Arranged:
    """Inputs laid out per query head and broadcast, in the computation dtype."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    allowed: np.ndarray
    bias: np.ndarray | None
    scale: float
    out_dtype: np.dtype

    def with_(self, **changes: Any) -> Arranged:
        return replace(self, **changes)


def arrange(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    alignment: str = "top_left",
    heads: Callable[[int, int], np.ndarray] = contiguous_groups,
) -> Arranged:
    """Check heads, broadcast batch dims, mask and bias, expand K/V to the query heads.

    ``allowed`` is the mask AND the causal rule (SDPA-3.1, SDPA-3.4, SDPA-4); a -inf
    bias is folded in later by :func:`scores`.
    """
    n_q_heads, n_queries, head_dim = q.shape[-3:]
    n_kv_heads, n_keys = k.shape[-3], k.shape[-2]
    check_heads(n_q_heads, n_kv_heads)
    batch = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    work = compute_dtype(q.dtype)
    kv_head = heads(n_q_heads, n_kv_heads)

    def per_query_head(a: np.ndarray) -> np.ndarray:
        a = np.broadcast_to(a, (*batch, *a.shape[-3:]))
        return np.take(a, kv_head, axis=-3).astype(work)

    scores_shape = (*batch, n_q_heads, n_queries, n_keys)
    allowed = np.ones(scores_shape, dtype=bool)
    if mask is not None:
        allowed = allowed & mask
    if is_causal:
        allowed = allowed & causal_table(n_queries, n_keys, alignment)
    return Arranged(
        q=np.broadcast_to(q, (*batch, *q.shape[-3:])).astype(work),
        k=per_query_head(k),
        v=per_query_head(v),
        allowed=allowed,
        bias=None if bias is None else np.broadcast_to(bias, scores_shape).astype(work),
        scale=default_scale(head_dim) if scale is None else float(scale),
        out_dtype=q.dtype,
    )


def scores(a: Arranged) -> tuple[np.ndarray, np.ndarray]:
    """Scaled, biased scores with -inf where not allowed, and the allowed set S(i).

    A -inf bias removes the key (SDPA-3.3); disallowed scores are replaced, never
    computed with, so a NaN there cannot reach the softmax (SDPA-8).
    """
    with np.errstate(**QUIET):  # NaN/inf inputs are legitimate (SDPA-8)
        s = np.matmul(a.q, np.swapaxes(a.k, -1, -2)) * a.q.dtype.type(a.scale)
        if a.bias is not None:
            s = s + a.bias
    allowed = a.allowed & (s != -np.inf)
    return np.where(allowed, s, -np.inf), allowed


def row_max(s: np.ndarray) -> np.ndarray:
    """Max over keys, 0 for a row with nothing allowed so shifting it stays NaN-free."""
    m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    return np.where(m == -np.inf, s.dtype.type(0), m)


def softmax_lse(s: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Weights exp(s - logsumexp(s)) over the allowed keys; empty rows are all 0 (SDPA-5).

    The exponent is formed as (s - m) - log(sum exp(s - m)), as log_softmax libraries
    do: forming lse = m + log(...) first rounds it to the precision of |m|, an error
    common to every weight of the row that grows with the score magnitude.
    """
    with np.errstate(**QUIET):
        shifted = s - row_max(s)
        log_total = np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
        return np.where(allowed, np.exp(shifted - log_total), s.dtype.type(0))


def combine(p: np.ndarray, allowed: np.ndarray, v: np.ndarray) -> np.ndarray:
    """sum_{j in S(i)} p_ij v_j: disallowed keys are left out of the sum, not multiplied
    by 0, so a non-finite value there cannot leak (SDPA-8.2)."""
    with np.errstate(**QUIET):
        terms = p[..., :, :, None] * v[..., None, :, :]
        return np.sum(np.where(allowed[..., None], terms, p.dtype.type(0)), axis=-2)


def finish(out: np.ndarray, a: Arranged) -> np.ndarray:
    """The output in q's dtype (SDPA-1.3)."""
    return out.astype(a.out_dtype)


def attend(a: Arranged) -> np.ndarray:
    """The log-sum-exp formulation end to end: scores, weights, weighted values."""
    s, allowed = scores(a)
    return finish(combine(softmax_lse(s, allowed), allowed, a.v), a)


def online_softmax(
    s: np.ndarray, allowed: np.ndarray, v: np.ndarray, *, block: int = 3, rescale: bool = True,
    tail: bool = True,
) -> np.ndarray:
    """FlashAttention-style pass over key blocks: a running max m, a running sum l and
    an accumulator rescaled by exp(m_old - m_new) whenever the max grows; the output
    is acc / l, and 0 where l = 0 (a row with nothing allowed, SDPA-5).  Returns the
    output directly: the weights never exist as a whole.

    ``rescale=False`` and ``tail=False`` exist only for the catalogue's two online-softmax
    bugs (accumulator not rescaled; ragged last block dropped).
    """
    n_keys = s.shape[-1]
    dtype = s.dtype.type
    m = np.full((*s.shape[:-1], 1), -np.inf, dtype=s.dtype)
    total = np.zeros_like(m)
    acc = np.zeros((*s.shape[:-1], v.shape[-1]), dtype=s.dtype)
    stop = n_keys if tail else n_keys - n_keys % block
    with np.errstate(**QUIET):
        for start in range(0, stop, block):
            blk = slice(start, min(start + block, stop))
            s_blk, ok = s[..., blk], allowed[..., blk]
            m_new = np.maximum(m, np.max(s_blk, axis=-1, keepdims=True))
            shift = np.where(m_new == -np.inf, dtype(0), m_new)
            correction = np.exp(m - shift) if rescale else np.ones_like(m)
            p = np.where(ok, np.exp(s_blk - shift), dtype(0))
            total = total * correction + np.sum(p, axis=-1, keepdims=True)
            acc = acc * correction + combine(p, ok, v[..., blk, :])
            m = m_new
        # total is 0 only for a row with nothing allowed; a NaN total must stay NaN.
        empty = total == 0
        return np.where(empty, dtype(0), acc / np.where(empty, dtype(1), total))
