"""Correct kernels with the features of spec/features.md and dropout, each an independent
NumPy formulation (nothing from ``attnspec.reference``).

They differ where real kernels do: weights from the log-sum-exp in natural log versus an
online softmax over key blocks in base 2 with FlashAttention's folding of the scale, the
cap and the ALiBi slope into one constant; bottom-right versus top-left anchors; slopes
passed versus computed; dropout rescaling the output at the end, as FlashAttention does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import packed_kernels
from .blocks import QUIET, finish, row_max
from .entry import ALL, SPEC_KEYWORDS, SpecCall, spec_kernel
from .feature_blocks import (
    Features,
    arranged,
    attend_features,
    distance,
    feature_scores,
    keep_mask,
    press_slopes,
    weighted,
)

Array = np.ndarray
LOG2E = math.log2(math.e)
# the claims of the two kernels with every feature of spec/features.md but dropout
FEATURES = {**ALL, "softcap": True, "alibi": True, "returns_lse": True}


@spec_kernel({**SPEC_KEYWORDS, "softcap": None, "alibi_slopes": None}, **FEATURES)
def features_lse(call: SpecCall) -> tuple[Array, Array]:
    """(f1) Scores of features.md in natural log, weights from the log-sum-exp, top-left."""
    f = Features(softcap=call.softcap, alibi_slopes=call.alibi_slopes)
    return attend_features(arranged(*call, f), f, returns_lse=True)


@spec_kernel(
    {**SPEC_KEYWORDS, "softcap": 0.0, "alibi_slopes": None},
    **FEATURES,
    causal_alignment="bottom_right",
)
def features_flash(call: SpecCall) -> tuple[Array, Array]:
    """(f2) FlashAttention 2's arithmetic: tanh of q.k times alpha/c, ALiBi as slope / c
    on that scale, c log2(e) folded into one factor, an online softmax over key blocks of
    64 in base 2, P rounded to the input dtype, the log-sum-exp converted back from base 2
    (as FlexAttention does); bottom-right; and its spelling of no softcap, 0.0 (SOFTCAP-4)."""
    f = Features(
        softcap=call.softcap or None, alibi_slopes=call.alibi_slopes, alignment="bottom_right"
    )
    a = arranged(*call, f)
    work = a.q.dtype.type
    # FA's scale_softmax: the cap, or the scale (1 for scale 0, where FlashAttention's
    # slope / scale_softmax would be infinite)
    unit = work(f.softcap if f.softcap is not None else (a.scale or 1.0))
    with np.errstate(**QUIET):
        raw = np.matmul(a.q, np.swapaxes(a.k, -1, -2))
        if f.softcap is not None:
            raw = np.tanh(raw * work(a.scale / f.softcap))
        elif a.scale == 0:
            raw = raw * work(0)
        if f.alibi_slopes is not None:
            slope = (
                np.broadcast_to(np.asarray(f.alibi_slopes, np.float32), a.q.shape[:-2]).astype(
                    a.q.dtype
                )
                / unit
            )
            raw = raw - slope[..., None, None] * distance(*raw.shape[-2:], f.alignment).astype(
                a.q.dtype
            )
        s2 = raw * work(unit * LOG2E)  # scores in base 2
        if a.bias is not None:
            s2 = s2 + a.bias * work(LOG2E)
    allowed = a.allowed & (s2 != -np.inf)
    s2 = np.where(allowed, s2, -np.inf)
    m = np.full((*s2.shape[:-1], 1), -np.inf, dtype=s2.dtype)
    total = np.zeros_like(m)
    acc = np.zeros((*s2.shape[:-1], a.v.shape[-1]), dtype=s2.dtype)
    with np.errstate(**QUIET):
        for start in range(0, s2.shape[-1], 64):
            blk = slice(start, start + 64)
            m_new = np.maximum(m, np.max(s2[..., blk], axis=-1, keepdims=True))
            shift = np.where(m_new == -np.inf, work(0), m_new)
            p = np.where(allowed[..., blk], np.exp2(s2[..., blk] - shift), 0)
            correction = np.exp2(m - shift)
            total = total * correction + p.sum(axis=-1, keepdims=True)
            p_rounded = p.astype(a.out_dtype).astype(s2.dtype)
            acc = acc * correction + weighted(p_rounded, allowed[..., blk], a.v[..., blk, :])
            m = m_new
        empty = total == 0
        out = np.where(empty, work(0), acc / np.where(empty, work(1), total))
        lse = np.where(empty, -np.inf, (m + np.log2(np.where(empty, 1, total))) * work(math.log(2)))
    return finish(out, a), lse[..., 0]


@spec_kernel(
    {**SPEC_KEYWORDS, "use_alibi": False},
    bias=True,
    gqa=True,
    alibi=True,
    alibi_builtin_slopes=True,
    alibi_keyword="use_alibi",
)
def alibi_builtin(call: SpecCall) -> Array:
    """(f3) ALiBi, when asked for, with the standard slopes for its own heads (ALIBI-3),
    as BLOOM and MPT compute them; top-left."""
    f = Features(alibi_slopes=press_slopes(call.q.shape[-3]) if call.use_alibi else None)
    return attend_features(arranged(*call, f), f)


@spec_kernel({**SPEC_KEYWORDS, "dropout_p": 0.0, "seed": None}, bias=True, gqa=True, dropout=True)
def dropout_attention(call: SpecCall) -> Array:
    """(f4) Dropout as FlashAttention applies it: unnormalised exponentials dropped by
    Bernoulli(1 - p) indicators from the seed, the undropped row sum, and the output
    multiplied by 1 / (sum (1 - p)) at the end."""
    dropout_p, seed = call.dropout_p, call.seed
    f = Features(dropout_p=dropout_p, seed=seed)
    a = arranged(*call, f)
    s, allowed = feature_scores(a, f)
    with np.errstate(**QUIET):
        e = np.where(allowed, np.exp(s - row_max(s)), 0).astype(s.dtype)
        total = e.sum(axis=-1, keepdims=True)
        kept = e * keep_mask(e.shape, dropout_p, seed)
        scale_back = s.dtype.type(1 / (1 - dropout_p))
        out = weighted(kept, allowed, a.v) / np.where(total == 0, 1, total) * scale_back
    return finish(out, a)


# (name, kernel) pairs that catalogue.correct lists among its correct kernels
FEATURE_KERNELS: list[tuple[str, Callable[..., Any]]] = [
    ("features-lse", features_lse),
    ("features-flash-bottom-right", features_flash),
    ("alibi-builtin-slopes", alibi_builtin),
    ("dropout", dropout_attention),
    ("varlen-block-diagonal", packed_kernels.varlen_block_diagonal),
    ("kv-cache-paged-in-place", packed_kernels.kv_cache_in_place),
    ("kv-cache-contiguous-in-place", packed_kernels.kv_cache_contiguous),
]
