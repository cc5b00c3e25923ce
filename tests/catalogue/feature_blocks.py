"""NumPy building blocks for the catalogue's feature kernels (spec/features.md, DROP-2).

Written from the spec's text, sharing nothing with ``attnspec.reference``: the scores
of features.md's Summary (scale, softcap, bias, ALiBi, then the mask), the standard ALiBi
slopes, the log-sum-exp, dropout drawn from a seed.  The correct kernels of
:mod:`catalogue.correct_features` compose them; each buggy kernel of
:mod:`catalogue.bugs_features` replaces exactly one step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .blocks import QUIET, Arranged, arrange, finish, row_max, softmax_lse


@dataclass(frozen=True)
class Features:
    """The feature arguments of one call, as a kernel received them."""

    softcap: float | None = None
    alibi_slopes: np.ndarray | None = None
    alignment: str = "top_left"
    dropout_p: float = 0.0
    seed: int | None = None
    sinks: np.ndarray | None = None  # (Hq,) sink logits (SINK-1)


def press_slopes(n_heads: int) -> np.ndarray:
    """ALIBI-3 written from the clause: 2^(-8(h+1)/H) for H a power of two; else those of
    the largest power of two P below H, then every other slope of 2P; exact in float64,
    as the clause defines them (a kernel rounds them to the dtype it computes in)."""

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    power = 2 ** math.floor(math.log2(n_heads))
    slopes = geometric(power)
    if power < n_heads:
        slopes += geometric(2 * power)[0::2][: n_heads - power]
    return np.asarray(slopes, dtype=np.float64)


def distance(n_queries: int, n_keys: int, alignment: str) -> np.ndarray:
    """|i + d - j|, d = 0 top-left or Lk - Lq bottom-right (ALIBI-2)."""
    offset = 0 if alignment == "top_left" else n_keys - n_queries
    return np.abs(np.arange(n_queries)[:, None] + offset - np.arange(n_keys)[None, :])


def alibi_bias(a: Arranged, slopes: np.ndarray, alignment: str) -> np.ndarray:
    """-m_h |i + d - j| per query head, ``(*batch, Hq, Lq, Lk)`` in the computation dtype."""
    n_queries, n_keys = a.q.shape[-2], a.k.shape[-2]
    per_head = np.broadcast_to(np.asarray(slopes, np.float64), a.q.shape[:-2])
    return (-per_head[..., None, None] * distance(n_queries, n_keys, alignment)).astype(a.q.dtype)


def arranged(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    bias: np.ndarray | None,
    is_causal: bool,
    scale: float | None,
    f: Features,
) -> Arranged:
    return arrange(
        q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale, alignment=f.alignment
    )


def softcapped(x: np.ndarray, softcap: float) -> np.ndarray:
    """SOFTCAP-1's c tanh(x / c), in the dtype of ``x``."""
    cap = x.dtype.type(softcap)
    with np.errstate(**QUIET):
        return cap * np.tanh(x / cap)


def feature_scores(a: Arranged, f: Features) -> tuple[np.ndarray, np.ndarray]:
    """features.md's scores: x = alpha q.k, c tanh(x / c), + bias, + ALiBi; -inf where the
    mask, the causal rule or a -inf bias excludes the key."""
    with np.errstate(**QUIET):
        s = np.matmul(a.q, np.swapaxes(a.k, -1, -2)) * a.q.dtype.type(a.scale)
        if f.softcap is not None:
            s = softcapped(s, f.softcap)
        if a.bias is not None:
            s = s + a.bias
        if f.alibi_slopes is not None:
            s = s + alibi_bias(a, f.alibi_slopes, f.alignment)
    allowed = a.allowed & (s != -np.inf)
    return np.where(allowed, s, -np.inf), allowed


def log_sum_exp(s: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """log sum_{j in S(i)} e^(s_ij), -inf for a row with nothing allowed (LSE-1, LSE-2);
    in the computation dtype (float32 for half precision: LSE-3)."""
    with np.errstate(**QUIET):
        m = row_max(s)
        total = np.sum(np.where(allowed, np.exp(s - m), 0), axis=-1, keepdims=True)
        return np.where(total > 0, m + np.log(np.where(total > 0, total, 1)), -np.inf)[..., 0]


def keep_mask(shape: tuple[int, ...], dropout_p: float, seed: int | None) -> np.ndarray:
    """Independent Bernoulli(1 - p) keep indicators from ``seed`` (DROP-3, DROP-4)."""
    if dropout_p == 0:
        return np.ones(shape, dtype=bool)
    return np.random.default_rng(seed).random(shape) >= dropout_p


# query rows per block of weighted(): each block's terms hold at most about this many
# elements (a packed call of 1792 x 1002 tokens, 9 heads and Ev = 128 would otherwise
# build 15 GiB of float64 terms at once)
_TERMS_PER_BLOCK = 1 << 24


def weighted(p: np.ndarray, allowed: np.ndarray, v: np.ndarray) -> np.ndarray:
    """sum over allowed j of p_ij v_j, in the dtype of ``p``; a masked key's value takes no
    part, not even as 0 * inf (SDPA-8.1).  Summed a block of query rows at a time: each
    row's sum is the same, only the memory is bounded."""
    rows = p.shape[-2]
    batch = np.broadcast_shapes(p.shape[:-2], allowed.shape[:-2], v.shape[:-2])
    per_row = max(1, int(np.prod(batch, dtype=np.int64)) * p.shape[-1] * v.shape[-1])
    step = max(1, _TERMS_PER_BLOCK // per_row)

    def block(part: slice) -> np.ndarray:
        keep = allowed if allowed.shape[-2] == 1 else allowed[..., part, :]
        terms = p[..., part, :, None] * v[..., None, :, :]
        return np.sum(np.where(keep[..., None], terms, p.dtype.type(0)), axis=-2)

    with np.errstate(**QUIET):
        if rows <= step:
            return block(slice(None))
        return np.concatenate([block(slice(i, i + step)) for i in range(0, rows, step)], axis=-2)


def sink_softmax(s: np.ndarray, allowed: np.ndarray, sinks: np.ndarray):
    """SINK-1's weights e^(s_ij) / (sum_l e^(s_il) + e^(sink_h)) and SINK-3's log-sum-exp,
    each row shifted by the larger of its top score and its head's sink (finite: a row
    without keys gets weights 0 and lse = sink_h)."""
    sink = np.asarray(sinks, s.dtype)[:, None, None]
    with np.errstate(**QUIET):
        top = np.maximum(np.max(s, axis=-1, keepdims=True, initial=-np.inf), sink)
        exps = np.where(allowed, np.exp(s - top), s.dtype.type(0))
        total = exps.sum(axis=-1, keepdims=True) + np.exp(sink - top)
        return exps / total, (top + np.log(total))[..., 0]


def attend_features(a: Arranged, f: Features, *, returns_lse: bool = False):
    """The definition end to end: scores, weights exp(s - lse) (with the sinks in the
    denominator, SINK-1), dropout (DROP-2), values; ``(out, lse)`` when ``returns_lse``."""
    s, allowed = feature_scores(a, f)
    if f.sinks is None:
        lse, p = log_sum_exp(s, allowed), softmax_lse(s, allowed)
    else:
        p, lse = sink_softmax(s, allowed, f.sinks)
    if f.dropout_p:
        p = p * keep_mask(p.shape, f.dropout_p, f.seed) / s.dtype.type(1 - f.dropout_p)
    out = finish(weighted(p, allowed, a.v), a)
    return (out, lse) if returns_lse else out
