"""Correct kernels, each an independent formulation of spec/dense.md in NumPy.

None of them calls or copies ``attnspec.reference``.  They differ where kernels in the
wild differ (log-sum-exp vs online softmax over ragged key blocks vs a gather per query
row; top-left vs bottom-right causal; returned weights; float16 weights rounded before
P·V; tiled and split-KV layouts with realistic block sizes), so the zero-false-failure
run shows the suite accepts every legitimate way of computing attention, not just the
reference's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from .blocks import (
    arrange,
    attend,
    check_heads,
    combine,
    compute_dtype,
    default_scale,
    finish,
    online_softmax,
    operands,
    scores,
    softmax_lse,
)
from .correct_features import FEATURE_KERNELS
from .entry import SpecCall, spec_kernel
from .tiled import Tiling, tiled

Array = np.ndarray


@spec_kernel(bias=True, gqa=True)
def lse_attention(call: SpecCall) -> Array:
    """(a) Weights exp(s - logsumexp(s)) over the allowed keys, then sum_j p_ij v_j."""
    return attend(call.pass_to(arrange))


@spec_kernel(bias=True, gqa=True, returns_weights=True)
def lse_attention_with_weights(call: SpecCall) -> tuple[Array, Array]:
    """(d) :func:`lse_attention` that also returns its weights, in q's dtype."""
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    p = softmax_lse(s, allowed)
    return finish(combine(p, allowed, a.v), a), finish(p, a)


def _online(
    q: Array,
    k: Array,
    v: Array,
    mask: Array | None,
    bias: Array | None,
    is_causal: bool,
    scale: float | None,
    alignment: str,
) -> Array:
    a = arrange(
        q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale, alignment=alignment
    )
    s, allowed = scores(a)
    return finish(online_softmax(s, allowed, a.v, block=3), a)


@spec_kernel(bias=True, gqa=True)
def online_softmax_attention(call: SpecCall) -> Array:
    """(b) Online softmax over key blocks of 3 (the last one ragged), FlashAttention-style."""
    q, k, v, mask, bias, is_causal, scale = call
    return _online(q, k, v, mask, bias, is_causal, scale, "top_left")


@spec_kernel(bias=True, gqa=True, causal_alignment="bottom_right")
def online_softmax_bottom_right(call: SpecCall) -> Array:
    """(d) :func:`online_softmax_attention` with bottom-right causal alignment (SDPA-4.2)."""
    q, k, v, mask, bias, is_causal, scale = call
    return _online(q, k, v, mask, bias, is_causal, scale, "bottom_right")


@spec_kernel(bias=True, gqa=True)
def half_precision_honest_attention(call: SpecCall) -> Array:
    """(e) FlashAttention's precision: scores and softmax in float32, P rounded to the
    input dtype before P·V (SDPA-7.7) accumulates in float32 — what TOL-2's u_d term admits."""
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    p = softmax_lse(s, allowed).astype(a.out_dtype).astype(s.dtype)
    return finish(combine(p, allowed, a.v), a)


@spec_kernel(bias=True, gqa=True)
def row_loop_attention(call: SpecCall) -> Array:
    """(c) One query row at a time: gather the keys of S(i), softmax them, sum their values.

    Self-contained (only the dtype rule and the head check are shared): disallowed keys
    are never gathered, so nothing at a masked position reaches arithmetic (SDPA-8).
    """
    q, k, v, mask, bias, is_causal, scale = call
    n_q_heads, n_queries, head_dim = q.shape[-3:]
    n_kv_heads, n_keys, value_dim = v.shape[-3:]
    check_heads(n_q_heads, n_kv_heads)
    group = n_q_heads // n_kv_heads
    batch = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    work = compute_dtype(q.dtype)
    q_, k_, v_ = (np.broadcast_to(x, (*batch, *x.shape[-3:])).astype(work) for x in (q, k, v))
    full = (*batch, n_q_heads, n_queries, n_keys)
    mask_ = None if mask is None else np.broadcast_to(mask, full)
    bias_ = None if bias is None else np.broadcast_to(bias, full).astype(work)
    factor = work.type(default_scale(head_dim) if scale is None else scale)
    out = np.zeros((*batch, n_q_heads, n_queries, value_dim), dtype=work)
    keys = np.arange(n_keys)
    # NaN/inf inputs (SDPA-8); entered once, not per row (~10 % of the loop's time)
    with np.errstate(invalid="ignore", over="ignore"):
        for index in np.ndindex(*batch, n_q_heads, n_queries):
            *b, h, i = index
            source = (*b, h // group)
            keep = np.ones(n_keys, dtype=bool) if mask_ is None else mask_[index].copy()
            if is_causal:
                keep &= keys <= i
            s = (k_[source][keep] @ q_[index]) * factor
            if bias_ is not None:
                s = s + bias_[index][keep]
            finite_bias = s != -np.inf
            if not finite_bias.any():
                continue
            s = s[finite_bias]
            e = np.exp(s - np.max(s))
            out[index] = (e[:, None] * v_[source][keep][finite_bias]).sum(axis=0) / e.sum()
    return out.astype(q.dtype)


@spec_kernel(bias=True, gqa=True)
def tiled_attention(call: SpecCall) -> Array:
    """(f) FlashAttention-2's layout: blocks of 128 query rows visit keys in blocks of 64
    with an online softmax, skipping key blocks past the causal boundary."""
    return tiled(
        call.pass_to(operands),
        Tiling(query_block=128, key_block=64),
    )


@spec_kernel(bias=True, gqa=True, causal_alignment="bottom_right")
def tiled_attention_bottom_right(call: SpecCall) -> Array:
    """(f) Blocks of 64 query rows and 128 keys, bottom-right causal (SDPA-4.2), as
    FlashAttention >= 2.1 aligns it."""
    return tiled(
        call.pass_to(partial(operands, alignment="bottom_right")),
        Tiling(query_block=64, key_block=128),
    )


@spec_kernel(bias=True, gqa=True, causal_alignment="bottom_right")
def split_kv_attention(call: SpecCall) -> Array:
    """(g) Flash-decoding: the keys split into chunks of 256, each chunk an online softmax
    over blocks of 64 giving (max, sum, normalised output), the chunks merged by
    log-sum-exp; bottom-right causal, as a KV-cache decoder uses it."""
    return tiled(
        call.pass_to(partial(operands, alignment="bottom_right")),
        Tiling(query_block=64, key_block=64, split=256),
    )


@spec_kernel(bias=True, gqa=True, empty_rows_zero=False)
def masked_fill_attention(call: SpecCall) -> Array:
    """(h) JAX's and Flax's rule: a disallowed score becomes the most negative finite
    number and every key enters the softmax, so a row with no allowed key weighs all keys
    alike and outputs mean(V).  It declares that it does not follow SDPA-5.1 (CONF-7): the
    suite must judge it on everything else, and find nothing."""
    a = call.pass_to(arrange)
    s, allowed = scores(a)
    filled = np.where(allowed, s, np.finfo(s.dtype).min)  # exp(min - row max) is exactly 0
    keyless = ~allowed.any(axis=-1, keepdims=True)
    p = softmax_lse(filled, np.ones_like(allowed))
    return finish(combine(p, allowed | keyless, a.v), a)


@dataclass(frozen=True)
class CorrectKernel:
    """A kernel the suite must pass on every applicable property, on ``backend``."""

    name: str
    fn: Callable[..., Any]
    backend: str = "numpy"


CORRECT: list[CorrectKernel] = [
    CorrectKernel("lse", lse_attention),
    CorrectKernel("lse-with-weights", lse_attention_with_weights),
    CorrectKernel("online-softmax", online_softmax_attention),
    CorrectKernel("online-softmax-bottom-right", online_softmax_bottom_right),
    CorrectKernel("row-loop", row_loop_attention),
    CorrectKernel("half-precision-honest", half_precision_honest_attention),
    CorrectKernel("tiled-128x64", tiled_attention),
    CorrectKernel("tiled-64x128-bottom-right", tiled_attention_bottom_right),
    CorrectKernel("split-kv-256", split_kv_attention),
    CorrectKernel("masked-fill-mean-v", masked_fill_attention),
    # spec/features.md and dropout (DROP-2)
    *(CorrectKernel(name, fn) for name, fn in FEATURE_KERNELS),
]
